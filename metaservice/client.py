"""Typed Python client of the MetaService REST API (httpx).

    >>> from metaservice.client import MetaServiceClient
    >>> with MetaServiceClient("http://127.0.0.1:8765") as ms:   # doctest: +SKIP
    ...     ms.put_job("enrich", inputs=["ods.orders"], outputs=["dwd.order_detail"])
    ...     version = ms.consistent_version(["dwd.order_detail", "dws.item_revenue"])

Its errors (``MetaServiceError`` and below: ``Unavailable``, ``ApiError`` with
``InvalidRequest``, ``NotFoundError``, ``ConflictError``) are in
:mod:`metaservice.client_errors`, which says what each means; they are importable from
here too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from metaservice.barriers.schemas import (
    BatchBarrier,
    CarriedBatchBarrier,
    CommitBatchResult,
    CommitReport,
    CommitResult,
    InputRange,
    NextBarrier,
    OfflineGrant,
)
from metaservice.client_errors import (
    UNAVAILABLE_STATUSES,
    ApiError,
    ConflictError,
    InvalidRequest,
    MetaServiceError,
    NotFoundError,
    Unavailable,
    error_for,
)
from metaservice.delay.schemas import Delay
from metaservice.lifecycle.schemas import ExpiryPlan, ExpiryResult, Retention
from metaservice.lineage.schemas import LineageGraph, SnapshotLineage
from metaservice.revisions.schemas import RevisionView
from metaservice.schemas_common import Page
from metaservice.topology.schemas import (
    JobEvent,
    JobView,
    SnapshotView,
    TableLogStatus,
    TableView,
)
from metaservice.versions.schemas import ConsistentVersion
from metaservice.versions.tags.schemas import TagView

M = TypeVar("M", bound=BaseModel)

__all__ = [
    "ApiError",
    "ConflictError",
    "InvalidRequest",
    "MetaServiceClient",
    "MetaServiceError",
    "NotFoundError",
    "Unavailable",
]


class MetaServiceClient:
    """One connection pool to one MetaService. Thread-safe; close it or use ``with``."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8765",
        *,
        token: str | None = None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url + "/api/v1", headers=headers, timeout=timeout, transport=transport
        )
        self._root = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> MetaServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()
        self._root.close()

    # -- plumbing ---------------------------------------------------------
    def _request(self, method: str, path: str, *, root: bool = False, **kwargs: Any) -> Any:
        client = self._root if root else self._http
        try:
            response = client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unavailable(f"MetaService at {self.url} is unreachable: {exc}") from exc
        if response.status_code in UNAVAILABLE_STATUSES:
            error = error_for(response)
            raise Unavailable(f"MetaService at {self.url} is unavailable: {error}")
        if response.status_code >= 400:
            raise error_for(response)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def _get(self, model: type[M], path: str, **params: Any) -> M:
        clean = {k: v for k, v in params.items() if v is not None}
        return model.model_validate(self._request("GET", path, params=clean))

    # -- topology ---------------------------------------------------------
    def put_job(
        self,
        name: str,
        *,
        inputs: Sequence[str] = (),
        outputs: Sequence[str],
        description: str = "",
    ) -> JobView:
        """Register or update a job (409 ConflictError on a cycle or a second writer)."""
        body = {"inputs": list(inputs), "outputs": list(outputs), "description": description}
        return JobView.model_validate(self._request("PUT", f"/jobs/{name}", json=body))

    def get_job(self, name: str) -> JobView:
        return self._get(JobView, f"/jobs/{name}")

    def delete_job(self, name: str) -> None:
        """Remove a job, its edges and its barrier history (admin); its outputs lose their
        writer. 409 ConflictError while another job reads one of its outputs."""
        self._request("DELETE", f"/jobs/{name}")

    def list_jobs(self, limit: int = 100, offset: int = 0) -> Page[JobView]:
        return self._get(Page[JobView], "/jobs", limit=limit, offset=offset)

    def all_jobs(self) -> list[JobView]:
        return _all_pages(lambda off: self.list_jobs(limit=500, offset=off))

    def job_event(self, name: str, event: JobEvent) -> JobView:
        """Record a listener event of the job's query; answers the job's view."""
        body = event.model_dump(exclude_none=True)
        return JobView.model_validate(self._request("POST", f"/jobs/{name}/events", json=body))

    def send_job_event(self, name: str, event: JobEvent) -> None:
        """Record a listener event without asking for the job's view back (``Prefer:
        return=minimal``, answered 204): what the Spark listener sends, since building
        the view costs the service more than recording the event. A MetaService that
        does not know the preference answers the view, which is dropped."""
        body = event.model_dump(exclude_none=True)
        headers = {"Prefer": "return=minimal"}
        self._request("POST", f"/jobs/{name}/events", json=body, headers=headers)

    def get_table(self, name: str) -> TableView:
        return self._get(TableView, f"/tables/{name}")

    def list_tables(self, limit: int = 100, offset: int = 0) -> Page[TableView]:
        return self._get(Page[TableView], "/tables", limit=limit, offset=offset)

    def all_tables(self) -> list[TableView]:
        return _all_pages(lambda off: self.list_tables(limit=500, offset=off))

    def put_table_log(
        self,
        table: str,
        *,
        mode: str,
        address: str | None = None,
        addresses: Sequence[str] | None = None,
    ) -> TableView:
        """Publish the table's log store: ``mode`` "embedded" or "external", and the
        address of its log service, or the ``addresses`` of the several its rows are
        spread over by partition (its writer calls this when the log starts)."""
        body: dict[str, Any] = {"mode": mode}
        if address is not None:
            body["address"] = address
        if addresses is not None:
            body["addresses"] = list(addresses)
        return TableView.model_validate(self._request("PUT", f"/tables/{table}/log", json=body))

    def get_table_log(self, table: str) -> TableLogStatus:
        """The table's log: mode and address, and what its log service holds now (entries,
        bytes, offsets, readers), as the MetaService asked it; ``reachable`` is False when
        the log service did not answer. 404 NotFoundError with code ``no_log`` for a table
        without a log.

        >>> ms.get_table_log("dw.orders").status.entries   # doctest: +SKIP
        12
        """
        return self._get(TableLogStatus, f"/tables/{table}/log")

    def delete_table_log(self, table: str) -> TableView:
        """The table has no log any more."""
        return TableView.model_validate(self._request("DELETE", f"/tables/{table}/log"))

    def table_snapshots(
        self,
        name: str,
        *,
        from_barrier: int | None = None,
        to_barrier: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> Page[SnapshotView]:
        return self._get(
            Page[SnapshotView],
            f"/tables/{name}/snapshots",
            from_barrier=from_barrier,
            to_barrier=to_barrier,
            limit=limit,
            offset=offset,
        )

    # -- barriers and commits -------------------------------------------
    def batch_barrier(
        self,
        job: str,
        batch_id: int,
        *,
        claim: int | None = None,
        start: int | None = None,
        end: int | None = None,
        query_id: str | None = None,
        reports: Sequence[CommitReport | dict[str, Any]] | None = None,
        progress: JobEvent | None = None,
        floor: int | None = None,
    ) -> CarriedBatchBarrier:
        """The barrier of a Spark batch (the same answer when the batch is replayed).

        ``claim``: the barrier a source job gave the batch itself while offline.
        ``start``/``end``: the offsets Spark planned for a derived batch (a batch the
        MetaService did not plan is refused: ``batch_plan_mismatch``, ``empty_range``).
        ``query_id``: the Spark query running the batch (``query_reset`` when the job's
        batches came from another query).

        One request per batch: ``reports`` (the job's earlier commit reports),
        ``progress`` (its listener event) and ``floor`` (a source job's offline-grant
        promise) ride along; the answer's ``carried`` says what became of each. A
        refused barrier raises as before; its error's ``carried`` says the same.
        """
        fields: dict[str, Any] = {
            "barrier": claim, "start": start, "end": end, "query_id": query_id, "floor": floor,
        }  # fmt: skip
        if reports:
            fields["reports"] = [
                r.model_dump() if isinstance(r, CommitReport) else dict(r) for r in reports
            ]
        if progress is not None:
            fields["progress"] = progress.model_dump(exclude_none=True)
        body = {k: v for k, v in fields.items() if v is not None} or None
        data = self._request("POST", f"/jobs/{job}/batches/{batch_id}/barrier", json=body)
        return CarriedBatchBarrier.model_validate(data)

    def abandon_batch(self, job: str, batch_id: int) -> BatchBarrier:
        """Give up a dead source driver's open batch (admin): its tables stop waiting for it."""
        data = self._request("POST", f"/jobs/{job}/batches/{batch_id}/abandon")
        return BatchBarrier.model_validate(data)

    def input_ranges(self, job: str, *, after: int, to: int) -> list[InputRange]:
        """What a derived batch (after, to] reads from each input, by the MetaService's mapping."""
        data = self._request("GET", f"/jobs/{job}/ranges", params={"after": after, "to": to})
        return [InputRange.model_validate(item) for item in data]

    def claim_barriers(
        self, job: str, claims: Iterable[tuple[int, int] | tuple[int, int, str | None]]
    ) -> list[BatchBarrier]:
        """Claim the barriers a source job gave its batches offline, in order, all or
        nothing: ``(batch_id, barrier)`` or ``(batch_id, barrier, query_id)`` each."""
        items = []
        for batch_id, barrier, *query in claims:
            item: dict[str, Any] = {"batch_id": batch_id, "barrier": barrier}
            if query and query[0] is not None:
                item["query_id"] = query[0]
            items.append(item)
        body = {"claims": items}
        data = self._request("POST", f"/jobs/{job}/claims", json=body)
        return [BatchBarrier.model_validate(item) for item in data["results"]]

    def offline_grant(self, job: str, floor: int) -> OfflineGrant:
        """Report in and take or renew the job's offline grant (see ``barriers/offline.py``)."""
        data = self._request("PUT", f"/jobs/{job}/offline-grant", json={"floor": floor})
        return OfflineGrant.model_validate(data)

    def release_offline_grant(self, job: str) -> None:
        self._request("DELETE", f"/jobs/{job}/offline-grant")

    def next_barrier(
        self,
        job: str,
        *,
        after: int | None = None,
        source: str | None = None,
        wait_ms: int = 0,
    ) -> NextBarrier:
        """The end of the job's batch that starts after ``after`` (default: its frontier);
        ``source``: the input table whose barrier source asks; ``wait_ms``: wait up to
        that long for a batch to become ready before answering "not ready"."""
        params = {"after": after, "source": source, "wait_ms": wait_ms or None}
        clean = {k: v for k, v in params.items() if v is not None}
        # A long poll answers up to wait_ms later than a plain request may.
        timeout = self._http.timeout.read
        if wait_ms and timeout is not None:
            timeout += wait_ms / 1000
        data = self._request(
            "GET", f"/jobs/{job}/next-barrier", params=clean, timeout=timeout or None
        )
        return NextBarrier.model_validate(data)

    def report_commit(
        self, job: str, batch_id: int, barrier: int, table: str, snapshot_id: int | None
    ) -> CommitResult:
        report = CommitReport(
            job=job, batch_id=batch_id, barrier=barrier, table=table, snapshot_id=snapshot_id
        )
        data = self._request("POST", "/commits", json=report.model_dump())
        return CommitResult.model_validate(data)

    def report_commits(self, reports: Iterable[CommitReport | dict[str, Any]]) -> CommitBatchResult:
        """Many reports in one request, all or nothing."""
        body = {
            "commits": [r.model_dump() if isinstance(r, CommitReport) else dict(r) for r in reports]
        }
        return CommitBatchResult.model_validate(self._request("POST", "/commits/batch", json=body))

    # -- queries -----------------------------------------------------------
    def consistent_version(
        self,
        tables: Sequence[str],
        *,
        at_or_before: int | None = None,
        lease_seconds: int | None = None,
    ) -> ConsistentVersion:
        """Snapshots of ``tables`` that belong together (409 ConflictError while none exists)."""
        return self._get(
            ConsistentVersion,
            "/versions/consistent",
            tables=",".join(tables),
            at_or_before=at_or_before,
            lease_seconds=lease_seconds,
        )

    def create_lease(
        self, tables: Sequence[str], lease_seconds: int, at_or_before: int | None = None
    ) -> ConsistentVersion:
        body = {"tables": list(tables), "lease_seconds": lease_seconds}
        if at_or_before is not None:
            body["at_or_before"] = at_or_before
        return ConsistentVersion.model_validate(self._request("POST", "/leases", json=body))

    def delete_lease(self, lease_id: str) -> None:
        self._request("DELETE", f"/leases/{lease_id}")

    def create_tag(
        self,
        name: str,
        tables: Sequence[str],
        *,
        at_or_before: int | None = None,
        retain_seconds: int | None = None,
        timeout: float | None = 120.0,
    ) -> TagView:
        """Publish the consistent version of ``tables`` as Iceberg tag ``name`` in each of
        them (admin); ``retain_seconds``: the tag ends that long after. 409 ConflictError
        ``tag_exists`` when the name is in use. ``timeout``: one Iceberg commit per table."""
        body: dict[str, Any] = {"name": name, "tables": list(tables)}
        if at_or_before is not None:
            body["at_or_before"] = at_or_before
        if retain_seconds is not None:
            body["retain_seconds"] = retain_seconds
        data = self._request("POST", "/versions/tags", json=body, timeout=timeout)
        return TagView.model_validate(data)

    def get_tag(self, name: str) -> TagView:
        return self._get(TagView, f"/versions/tags/{name}")

    def list_tags(
        self, *, table: str | None = None, limit: int = 100, offset: int = 0
    ) -> Page[TagView]:
        return self._get(Page[TagView], "/versions/tags", table=table, limit=limit, offset=offset)

    def all_tags(self, *, table: str | None = None) -> list[TagView]:
        """Every tag that has not ended, by name (on ``table`` only, if given)."""
        return _all_pages(lambda off: self.list_tags(table=table, limit=500, offset=off))

    def delete_tag(self, name: str, *, timeout: float | None = 120.0) -> TagView:
        """Remove the tag's Iceberg tags and its record (admin); returns the tag removed."""
        data = self._request("DELETE", f"/versions/tags/{name}", timeout=timeout)
        return TagView.model_validate(data)

    def create_revision(
        self, table: str, from_barrier: int, *, timeout: float | None = 120.0
    ) -> RevisionView:
        """Plan a revision of ``table`` and everything downstream of it from
        ``from_barrier`` (admin): one mirror table per affected table, starting at its
        snapshot at that barrier. 409 ConflictError ``revision_overlaps``, ``expired``,
        ``not_reached``, ``not_exact``, ``no_writer``. ``timeout``: one catalog commit per
        mirror."""
        body = {"table": table, "from_barrier": from_barrier}
        data = self._request("POST", "/revisions", json=body, timeout=timeout)
        return RevisionView.model_validate(data)

    def get_revision(self, revision_id: int) -> RevisionView:
        return self._get(RevisionView, f"/revisions/{revision_id}")

    def list_revisions(self, *, limit: int = 100, offset: int = 0) -> Page[RevisionView]:
        return self._get(Page[RevisionView], "/revisions", limit=limit, offset=offset)

    def all_revisions(self) -> list[RevisionView]:
        """Every revision, newest first (cancelled ones too)."""
        return _all_pages(lambda off: self.list_revisions(limit=500, offset=off))

    def cancel_revision(self, revision_id: int, *, timeout: float | None = 120.0) -> RevisionView:
        """Cancel the revision and drop its mirrors, deleting no file (admin); cancelling
        a cancelled revision answers it again."""
        data = self._request("DELETE", f"/revisions/{revision_id}", timeout=timeout)
        return RevisionView.model_validate(data)

    def swap_revision(self, revision_id: int, *, wait_seconds: float = 30) -> RevisionView:
        """Swap a ready revision's mirrors in for their originals (admin): the original
        jobs are superseded (409 ``superseded`` on their next barrier request), and once
        every mirror has reached its original the tables change names in one step. The
        answer's ``state`` is ``swapped``, or ``swapping`` when the mirrors did not get
        there within ``wait_seconds`` (call again to continue). 409 ConflictError
        ``not_ready``, ``revision_cancelled``::

            view = ms.swap_revision(7, wait_seconds=60)
            while view.state == "swapping":
                view = ms.swap_revision(7, wait_seconds=60)
        """
        data = self._request(
            "POST",
            f"/revisions/{revision_id}/swap",
            json={"wait_seconds": wait_seconds},
            timeout=wait_seconds + 120.0,
        )
        return RevisionView.model_validate(data)

    def lineage(
        self, table: str, *, direction: str = "both", depth: int | None = None
    ) -> LineageGraph:
        return self._get(LineageGraph, "/lineage", table=table, direction=direction, depth=depth)

    def snapshot_lineage(self, table: str, snapshot_id: int) -> SnapshotLineage:
        return self._get(SnapshotLineage, f"/lineage/snapshots/{table}/{snapshot_id}")

    def delay(self, table: str) -> Delay:
        return self._get(Delay, "/delay", table=table)

    def expirable(self, table: str) -> ExpiryPlan:
        return self._get(ExpiryPlan, f"/tables/{table}/expirable")

    def expire(
        self, table: str, *, dry_run: bool = False, timeout: float | None = 600.0
    ) -> ExpiryResult:
        """Expire the table's unused snapshots and delete the files only they used (admin);
        ``dry_run``: only list them. ``timeout``: an expiry reads every manifest of the
        table, so it may take longer than an ordinary request."""
        data = self._request(
            "POST", f"/tables/{table}/expire", json={"dry_run": dry_run}, timeout=timeout
        )
        return ExpiryResult.model_validate(data)

    def retention(self, table: str) -> Retention:
        """The table's retention policy as it applies (its own, else the defaults)."""
        return self._get(Retention, f"/tables/{table}/retention")

    def set_retention(
        self, table: str, *, keep_last: int | None = None, keep_for_seconds: int | None = None
    ) -> Retention:
        """Set the table's whole retention policy (admin); a value left out follows the
        service's default. Give at least one."""
        body = {"keep_last": keep_last, "keep_for_seconds": keep_for_seconds}
        data = self._request("PUT", f"/tables/{table}/retention", json=body)
        return Retention.model_validate(data)

    def reset_retention(self, table: str) -> Retention:
        """Drop the table's own retention policy (admin): the defaults apply again."""
        return Retention.model_validate(self._request("DELETE", f"/tables/{table}/retention"))

    # -- operations --------------------------------------------------------
    def health(self) -> bool:
        try:
            self._request("GET", "/healthz", root=True)
        except MetaServiceError:
            return False
        return True

    def ready(self) -> dict[str, Any]:
        return self._request("GET", "/readyz", root=True)  # type: ignore[no-any-return]


def _all_pages(fetch: Any) -> list[Any]:
    items: list[Any] = []
    while True:
        page = fetch(len(items))
        items.extend(page.items)
        if not page.items or len(items) >= page.total:
            return items
