"""The log service over HTTP (Starlette + uvicorn): embedded in a writing Spark driver
(:class:`LogService` in a background thread) or standalone (``metaservice log start``).

Routes (prefix ``/v1``; errors are JSON ``{"code", "message", "field"}``; bad input gets
4xx and changes nothing):

======  ==========================================  ============================================
POST    ``/tables/{table}/entries?barrier&batch_id``  append rows (body: Arrow IPC stream)
POST    ``/tables/{table}/persisted``                 ``{"barrier","batch_id","snapshot_id"}``
POST    ``/tables/{table}/spilled``                   ``{"batch_id"}``: the batch's spilled files,
                                                      for its snapshot summary
POST    ``/tables/{table}/reset[?job]``               ``{"after_batch_id"}``: drop past it, new
                                                      epoch; the job's batches from now on
                                                      (null: drop all, forget the marks; 404
                                                      ``log_table_unknown`` when none held)
GET     ``/tables/{table}/entries``                   ``after_seq&epoch`` or ``after_batch[&job]``;
                                                      rows as Arrow IPC with offset columns; 410
                                                      ``log_gone``, 409 ``log_reset``
GET     ``/status[?table=T]``                         each table's offsets, bytes, epoch, readers
GET     ``/identity?nonce=N``                         the proof that the service holds its token
                                                      (:mod:`~metaservice.logstore.proof`)
GET     ``/healthz``
======  ==========================================  ============================================

With auth (:class:`~metaservice.logstore.auth.LogAuth`) every ``/v1`` route but
``/identity`` needs a bearer token the MetaService accepts: a writer's to append, mark
persisted, reset and claim spilled files, a reader's to read and see the status. Bodies
are bounded while they stream (413), and so is what an Arrow body decodes to
(:class:`BodyLimits`); a table's memory and spill space are bounded by its
:class:`~metaservice.logstore.store.TableLog`.

Usage (embedded)::

    with LogService() as service:          # a free port on loopback
        writer = LogWriter(service.url)
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from metaservice.auth.schemas import Role
from metaservice.errors import Invalid, NotFound, ServiceError, TooLarge
from metaservice.logstore import ipc, proof, wire
from metaservice.logstore.auth import LogAuth, check_listen
from metaservice.logstore.entries import TableStatus
from metaservice.logstore.openapi import log_openapi
from metaservice.logstore.store import LogStore, TableLog
from metaservice.names import JOB_PATTERN, check_table_name

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["BodyLimits", "LogService", "create_log_app", "serve"]

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger(__name__)

MAX_SIGNED_64 = 2**63 - 1
MAX_INFLATION = 100  # a compressed body decodes to at most this many times its size
MAX_JSON_BYTES = 64 * 1024
# The MetaService's code for a request its schema refuses ("invalid": one that breaks a rule).
MALFORMED = "invalid_request"
MAX_READER_ID = 200
_JOB = re.compile(JOB_PATTERN)


class PersistedBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    barrier: int = Field(ge=0, le=MAX_SIGNED_64)
    batch_id: int = Field(ge=0, le=MAX_SIGNED_64)
    snapshot_id: int = Field(ge=-MAX_SIGNED_64 - 1, le=MAX_SIGNED_64)


class SpilledBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    batch_id: int = Field(ge=0, le=MAX_SIGNED_64)


class ResetBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    after_batch_id: int | None = Field(
        ge=-1,
        le=MAX_SIGNED_64,
        description="-1: nothing committed; null: the table's history restarts (a "
        "revision swap): drop everything and forget the persisted marks",
    )


@dataclass(frozen=True)
class BodyLimits:
    """How much one request may bring: an append's Arrow body as sent (``body_bytes``) and
    as its record batches take once decoded (``inflated_bytes``, and at most
    ``MAX_INFLATION`` times a compressed body's size); a JSON body is small."""

    body_bytes: int = wire.DEFAULT_MAX_BODY_BYTES
    inflated_bytes: int = wire.DEFAULT_MAX_INFLATED_BYTES
    json_bytes: int = MAX_JSON_BYTES


def create_log_app(
    store: LogStore, *, auth: LogAuth | None = None, limits: BodyLimits | None = None
) -> Starlette:
    """The log service's ASGI application over ``store``; ``auth``: check every caller's
    bearer token with the MetaService (None: serve anyone, on loopback only)."""
    bounds = limits or BodyLimits()

    async def allow(request: Request, needed: Role, action: str, table: str | None) -> None:
        if auth is None:
            return
        writing = table if needed is Role.WRITER else None
        access = await auth.access(request.headers.get("authorization"), writing)
        access.check(needed, table, action)

    async def append(request: Request) -> Response:
        table = _table(request)
        await allow(request, Role.WRITER, "append", table)
        barrier = _int_param(request, "barrier", minimum=0)
        batch_id = _int_param(request, "batch_id", minimum=0)
        if barrier is None or batch_id is None:
            raise Invalid("barrier and batch_id are required", field="barrier", code=MALFORMED)
        body = await _read_body(request, bounds.body_bytes)
        batches = _decode(body, bounds)
        log_ = store.table(table)
        entries = log_.append_all(barrier, batch_id, batches)
        return JSONResponse(
            {
                "epoch": log_.epoch,
                "seqs": [e.seq for e in entries],
                "rows": sum(b.num_rows for b in batches),
            }
        )

    async def persisted(request: Request) -> Response:
        table = _table(request)
        await allow(request, Role.WRITER, "persisted", table)
        body = _json_body(await _read_body(request, bounds.json_bytes), PersistedBody)
        mark = store.table(table).persisted(body.barrier, body.batch_id, body.snapshot_id)
        return JSONResponse(asdict(mark))

    async def spilled(request: Request) -> Response:
        table = _table(request)
        await allow(request, Role.WRITER, "spilled", table)
        body = _json_body(await _read_body(request, bounds.json_bytes), SpilledBody)
        files = store.table(table).claim_spilled(body.batch_id)
        return JSONResponse({"batch_id": body.batch_id, "files": files})

    async def reset(request: Request) -> Response:
        table = _table(request)
        await allow(request, Role.WRITER, proof.RESET, table)
        body = _json_body(await _read_body(request, bounds.json_bytes), ResetBody)
        # The writer's job: a query parameter, as an append's batch is, so that a log
        # service older than it ignores it (answering by batch alone) and the reset works.
        job = _job(request)
        if job is not None and body.after_batch_id is None:
            raise Invalid("a reset that keeps no batch names no job", field="job")
        # A writer's reset makes the table's log; with none there is no history to drop.
        table_log = store.existing(table) if body.after_batch_id is None else store.table(table)
        return JSONResponse({"epoch": table_log.reset(body.after_batch_id, job)})

    async def read(request: Request) -> Response:
        table = _table(request)
        await allow(request, Role.READER, "read", table)
        table_log = store.existing(table)
        result = table_log.read(
            after_seq=_int_param(request, "after_seq", minimum=0),
            epoch=_int_param(request, "epoch", minimum=0),
            after_batch=_int_param(request, "after_batch", minimum=-1),
            job=_job(request),
            max_bytes=_int_param(request, "max_bytes", minimum=1),
            reader=_reader(request),
        )
        headers = {wire.EPOCH_HEADER: str(result.epoch), wire.NEXT_SEQ_HEADER: str(result.next_seq)}
        if result.committed is not None:
            headers[wire.COMMITTED_BATCH_HEADER] = str(result.committed.batch_id)
            headers[wire.COMMITTED_SNAPSHOT_HEADER] = str(result.committed.snapshot_id)
        if result.job is not None:
            headers[wire.JOB_HEADER] = result.job
        if not result.entries:
            return Response(b"", headers=headers, media_type=wire.ARROW_STREAM)
        batches = [
            ipc.with_offsets(table_log.rows_of(e), e.barrier, e.batch_id, e.seq)
            for e in result.entries
        ]
        body = ipc.encode(batches, batches[0].schema)
        return Response(body, headers=headers, media_type=wire.ARROW_STREAM)

    async def status(request: Request) -> Response:
        name = request.query_params.get("table")
        table = check_table_name(name) if name else None
        await allow(request, Role.READER, proof.READ_STATUS, table)
        tables: list[TableLog] = (
            [store.existing(table)] if table else [store.table(n) for n in store.names()]
        )
        return JSONResponse({"tables": [status_json(t.status()) for t in tables]})

    async def identity(request: Request) -> Response:
        nonce = request.query_params.get("nonce", "")
        if not 16 <= len(nonce) <= 200 or not nonce.isalnum():
            raise Invalid("nonce: 16 to 200 letters and digits", field="nonce", code=MALFORMED)
        answer = auth.identity(nonce) if auth is not None else None
        if answer is None:
            raise NotFound(
                "this log service holds no token of its own to prove who it is",
                code="no_identity",
            )
        return JSONResponse(answer)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def document(request: Request) -> Response:
        """The routes as OpenAPI (they describe the service and hold no data: open)."""
        return JSONResponse(log_openapi(PersistedBody, SpilledBody, ResetBody))

    prefix = wire.API_PREFIX
    routes = [
        Route(f"{prefix}/tables/{{table}}/entries", append, methods=["POST"]),
        Route(f"{prefix}/tables/{{table}}/entries", read, methods=["GET"]),
        Route(f"{prefix}/tables/{{table}}/persisted", persisted, methods=["POST"]),
        Route(f"{prefix}/tables/{{table}}/spilled", spilled, methods=["POST"]),
        Route(f"{prefix}/tables/{{table}}/reset", reset, methods=["POST"]),
        Route(f"{prefix}/status", status, methods=["GET"]),
        Route(f"{prefix}/identity", identity, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/openapi.json", document, methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={ServiceError: _service_error, HTTPException: _http_error},
    )


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is past ``limit``: never buffered whole first."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the body is past {limit} bytes", field="body")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the body is past {limit} bytes", field="body")
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(body: bytes, bounds: BodyLimits) -> list[pa.RecordBatch]:
    """The body's record batches with rows, bounded by what they inflate to before any is
    decoded (a few KB of zstd can stand for gigabytes)."""
    try:
        inflated = ipc.inflated_size(body)
    except ValueError as exc:
        raise Invalid(str(exc), field="body", code=MALFORMED) from None
    most = min(bounds.inflated_bytes, max(len(body), 1) * MAX_INFLATION)
    if inflated > most:
        raise TooLarge(
            f"the body's record batches take {inflated} bytes once decoded, past the log "
            f"service's bound of {most} ({bounds.inflated_bytes}, or {MAX_INFLATION} times "
            "the body): append smaller chunks",
            field="body",
        )
    try:
        return [b for b in ipc.decode(body) if b.num_rows]
    except ValueError as exc:
        raise Invalid(str(exc), field="body", code=MALFORMED) from None


def status_json(status: TableStatus) -> dict[str, Any]:
    """A table's status as the service answers it (and the CLI prints it)."""
    body = asdict(status)
    for key in ("first", "last"):
        offset = body[key]
        body[key] = (
            None
            if offset is None
            else dict(zip(("barrier", "batch_id", "seq"), offset, strict=True))
        )
    return body


def _reader(request: Request) -> str | None:
    reader = request.query_params.get("reader")
    if reader is not None and len(reader) > MAX_READER_ID:
        raise Invalid(
            f"reader is longer than {MAX_READER_ID} characters", field="reader", code=MALFORMED
        )
    return reader


def _job(request: Request) -> str | None:
    job = request.query_params.get("job")
    if job is not None and not _JOB.fullmatch(job):
        raise Invalid(f"job {job[:210]!r} is not a job name", field="job", code=MALFORMED)
    return job


def _table(request: Request) -> str:
    return check_table_name(request.path_params["table"])


def _int_param(request: Request, name: str, *, minimum: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise Invalid(
            f"{name} must be an integer, not {raw!r}", field=name, code=MALFORMED
        ) from None
    if not minimum <= value <= MAX_SIGNED_64:
        raise Invalid(
            f"{name} must be between {minimum} and {MAX_SIGNED_64}", field=name, code=MALFORMED
        )
    return value


def _json_body(body: bytes, model: type[M]) -> M:
    try:
        parsed = json.loads(body.decode("utf-8") if body else "null")
    except UnicodeDecodeError:
        raise Invalid("the body is not UTF-8 text", field="body", code=MALFORMED) from None
    except (ValueError, RecursionError):  # JSONDecodeError, or nested past the parser's depth
        raise Invalid(
            "the body is not JSON (or nests too deep)", field="body", code=MALFORMED
        ) from None
    try:
        return model.model_validate(parsed)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise Invalid(f"{where}: {first['msg']}", field=where, code=MALFORMED) from None


async def _service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse({"code": code, "message": str(exc.detail)}, status_code=exc.status_code)


class LogService:
    """The log service in a background thread of this process (``log="embedded"``).

    ``port=0`` takes a free port; :attr:`url` is the address writers and readers use:
    on a cluster, listen on ``host="0.0.0.0"`` and give the name executors reach the
    driver by as ``advertised_host``; beyond loopback it needs ``auth`` (it refuses to
    start without: :class:`~metaservice.logstore.auth.LogAuthError`). ``start()``/``stop()``,
    or use it as a context manager.
    """

    def __init__(
        self,
        store: LogStore | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertised_host: str | None = None,
        auth: LogAuth | None = None,
        limits: BodyLimits | None = None,
    ) -> None:
        prepare(host, auth)
        self.store = store if store is not None else LogStore()
        self.auth = auth
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = host, self._socket.getsockname()[1]
        self.advertised_host = advertised_host or host
        config = uvicorn.Config(
            create_log_app(self.store, auth=auth, limits=limits),
            log_config=None,
            access_log=False,
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name="log-service",
            daemon=True,
        )

    @property
    def url(self) -> str:
        return f"http://{self.advertised_host}:{self.port}"

    def start(self, timeout: float = 20.0) -> Self:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the log service on {self.url} did not start")
            time.sleep(0.01)
        log.info("log service listening on %s", self.url)
        return self

    def stop(self, timeout: float = 20.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
        self._socket.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def prepare(host: str, auth: LogAuth | None) -> None:
    """Check what a log service needs before it listens: with ``auth``, a MetaService that
    answers (and the own token's id); beyond loopback, auth that means something
    (:class:`~metaservice.logstore.auth.LogAuthError` otherwise)."""
    check_listen(host, auth)
    if auth is not None and auth.token is not None and auth.token_id is None:
        auth.check_metaservice()


def serve(
    store: LogStore,
    *,
    host: str,
    port: int,
    auth: LogAuth | None = None,
    limits: BodyLimits | None = None,
) -> None:
    """Run the log service in this thread until interrupted (Ctrl-C stops it cleanly)."""
    prepare(host, auth)
    app = create_log_app(store, auth=auth, limits=limits)
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False)
