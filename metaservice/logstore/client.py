"""HTTP clients of the log service: :class:`LogWriter` (executors and the writing driver)
and :class:`LogClient` (readers and ``metaservice log status``).

Both need httpx and pyarrow only (no server, no pyspark). A writer is built from a URL
and pickles to it, so a Spark driver can ship it to its executors' Python workers::

    writer = LogWriter("http://127.0.0.1:7070")
    writer.append("dw.orders", barrier=b, batch_id=7, rows=arrow_table)   # executors
    writer.claim_spilled("dw.orders", batch_id=7)                         # driver, before commit
    writer.persisted("dw.orders", barrier=b, batch_id=7, snapshot_id=s)   # driver, after commit
    writer.reset("dw.orders", after_batch_id=6, job="enrich")             # driver, on restart

Errors:

    LogError
    ├── LogUnavailable      the log service could not be reached, or answered 5xx
    └── LogApiError         4xx; .status, .code, .message, .field
        ├── LogGoneError    410: the position is older than what the log holds
        ├── LogResetError   409 log_reset: the log's epoch changed (a writer restarted)
        └── LogFullError    409 log_full: the log is at its bounds; the batch goes to the
                            table only (the log falls behind, readers read snapshots)

A log service that checks tokens (``metaservice log start --metaservice-url``) answers
401/403 without a fitting one: give ``token=`` (register(..., token=...) does for its
writers, :meth:`LogReader.from_metaservice` takes the MetaService client's).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from metaservice.error_bodies import error_body
from metaservice.logstore import wire

if TYPE_CHECKING:
    import pyarrow as pa

    from metaservice.client import MetaServiceClient

__all__ = [
    "LogApiError",
    "LogClient",
    "LogError",
    "LogFullError",
    "LogGoneError",
    "LogRead",
    "LogResetError",
    "LogUnavailable",
    "LogWriter",
]


class LogError(Exception):
    """Anything that went wrong talking to a log service."""


class LogUnavailable(LogError):
    """The log service could not be reached or failed."""


class LogApiError(LogError):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" (field {field})" if field else ""))
        self.status, self.code, self.message, self.field = status, code, message, field


class LogGoneError(LogApiError):
    pass


class LogResetError(LogApiError):
    pass


class LogFullError(LogApiError):
    pass


@dataclass(frozen=True)
class LogRead:
    """One read's answer: rows (with the offset columns) or None, and where to go on."""

    rows: pa.Table | None
    epoch: int
    next_seq: int
    committed_batch: int | None  # the newest committed batch the reader now has in full
    committed_snapshot: int | None
    job: str | None = None  # whose batch ids the log holds (None: its writer named none)


class _Http:
    """A lazily built connection pool; pickles to its URL and token (for Spark executors).
    ``token``: a bearer token the MetaService accepts (a writer's to write, a reader's to
    read), for a log service that checks them."""

    def __init__(self, url: str, timeout: float = 10.0, *, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._token = token
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "timeout": self.timeout, "token": self._token}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["timeout"], token=state.get("token"))  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
                self._client = httpx.Client(
                    base_url=self.url + wire.API_PREFIX, timeout=self.timeout, headers=headers
                )
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http().request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise LogUnavailable(f"log service at {self.url} is unreachable: {exc}") from exc
        if response.status_code >= 500:
            raise LogUnavailable(
                f"log service at {self.url} failed: {response.status_code} {response.text[:300]}"
            )
        if response.status_code >= 400:
            raise _error_for(response)
        return response


def _error_for(response: httpx.Response) -> LogApiError:
    e = error_body(response)
    cls = LogGoneError if e.status == 410 else LogApiError
    if e.code == wire.RESET_CODE:
        cls = LogResetError
    elif e.code == wire.FULL_CODE:
        cls = LogFullError
    return cls(e.status, e.code, e.message, e.field)


class LogWriter(_Http):
    """Appends rows, marks batches persisted and resets a table's log."""

    def append(
        self, table: str, *, barrier: int, batch_id: int, rows: pa.Table | pa.RecordBatch
    ) -> list[int]:
        """Append the rows of one micro-batch (from an executor, before the commit); returns
        the seqs the log gave them (one per record batch; [] when there were no rows)."""
        import pyarrow as pa  # here: `log status` runs on the base install, without pyarrow

        from metaservice.logstore import ipc

        batches = rows.to_batches() if isinstance(rows, pa.Table) else [rows]
        if not any(b.num_rows for b in batches):
            return []
        body = ipc.encode(batches, rows.schema)
        response = self._send(
            "POST",
            f"/tables/{table}/entries",
            params={"barrier": barrier, "batch_id": batch_id},
            content=body,
            headers={"Content-Type": wire.ARROW_STREAM},
        )
        return list(response.json()["seqs"])

    def persisted(self, table: str, *, barrier: int, batch_id: int, snapshot_id: int) -> None:
        """Batch ``batch_id`` is committed in ``snapshot_id`` (the driver, after the commit)."""
        body = {"barrier": barrier, "batch_id": batch_id, "snapshot_id": snapshot_id}
        self._send("POST", f"/tables/{table}/persisted", json=body)

    def claim_spilled(self, table: str, *, batch_id: int) -> list[str]:
        """The files the log spilled batch ``batch_id``'s rows to, for its snapshot summary
        (the driver, right before the commit); from then on the snapshot's expiry deletes
        them."""
        response = self._send("POST", f"/tables/{table}/spilled", json={"batch_id": batch_id})
        return [str(path) for path in response.json()["files"]]

    def reset(self, table: str, *, after_batch_id: int | None, job: str | None = None) -> int:
        """The writer restarts after its last committed batch (-1: none): the log drops what
        it holds past it; returns the new epoch. ``job``, the writer's job, tells the log
        whose batch ids it holds, so it does not answer a reader by another job's batch
        (give it: without it a reader whose position is another job's batch may skip
        rows). None: the table's history restarts (the MetaService, at a revision swap):
        the log drops everything and forgets the persisted marks and the job (404
        ``log_table_unknown`` when it holds nothing of the table)."""
        response = self._send(
            "POST",
            f"/tables/{table}/reset",
            params={} if job is None else {"job": job},
            json={"after_batch_id": after_batch_id},
        )
        return int(response.json()["epoch"])


class LogClient(_Http):
    """Reads a log service: rows after a position, and its status."""

    def read(
        self,
        table: str,
        *,
        after_seq: int | None = None,
        epoch: int | None = None,
        after_batch: int | None = None,
        job: str | None = None,
        reader: str | None = None,
        max_bytes: int | None = None,
    ) -> LogRead:
        """The rows after ``after_seq`` in ``epoch``, or after batch ``after_batch`` of
        ``job`` (the job that stamped the snapshot the reader has: a log of another job
        answers from its start when it holds all of that job's batches, else 410)."""
        params = {
            "after_seq": after_seq,
            "epoch": epoch,
            "after_batch": after_batch,
            "job": job,
            "reader": reader,
            "max_bytes": max_bytes,
        }
        response = self._send(
            "GET",
            f"/tables/{table}/entries",
            params={k: v for k, v in params.items() if v is not None},
        )
        from metaservice.logstore import ipc

        headers = response.headers
        return LogRead(
            rows=ipc.as_table(response.content),
            epoch=int(headers[wire.EPOCH_HEADER]),
            next_seq=int(headers[wire.NEXT_SEQ_HEADER]),
            committed_batch=_optional_int(headers.get(wire.COMMITTED_BATCH_HEADER)),
            committed_snapshot=_optional_int(headers.get(wire.COMMITTED_SNAPSHOT_HEADER)),
            job=headers.get(wire.JOB_HEADER),
        )

    def status(self, table: str | None = None) -> list[dict[str, Any]]:
        """Each table's log: epoch, entries, bytes, first and last offsets, readers."""
        params = {"table": table} if table else {}
        return list(self._send("GET", "/status", params=params).json()["tables"])


def token_of(metaservice: MetaServiceClient) -> str | None:
    """The bearer token a MetaService client sends (None: none), for its log services."""
    auth = metaservice._http.headers.get("Authorization", "")
    return auth.removeprefix("Bearer ") or None


def _optional_int(raw: str | None) -> int | None:
    return None if raw is None else int(raw)
