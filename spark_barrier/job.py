"""``register``: one call that makes a Spark streaming query a barrier-aligned job.

job = spark_barrier.register(
    spark, "http://127.0.0.1:8765", job="build_order_detail",
    inputs=["ods.orders", "ods.items"], outputs={"dwd.order_detail": DETAIL_SCHEMA},
)
orders = job.source("ods.orders")                       # offsets are barriers
sink = job.sink("dwd.order_detail", transform=enrich)   # foreachBatch function
query = job.start(orders, sink)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from metaservice.barriers.schemas import BatchBarrier
from metaservice.client import ApiError, ConflictError, MetaServiceClient, Unavailable
from metaservice.settings import Settings
from spark_barrier.faults import crash_point
from spark_barrier.iceberg_io import (
    Mode,
    commit_batch,
    ensure_table,
    find_batch_commit,
    open_catalog,
)
from spark_barrier.listener import BarrierListener
from spark_barrier.offline import OfflineBarriers
from spark_barrier.reads import read_at_barrier
from spark_barrier.report import DirectReporter, OutboxReporter, Reporter, retry
from spark_barrier.source import SOURCE_NAME, BarrierSource

log = logging.getLogger("spark_barrier")


class BarrierConfigError(Exception):
    """The job cannot run as configured; the message says what to change."""


@dataclass
class BatchContext:
    """What a transform knows about the batch it runs in."""

    job: BarrierJob
    batch_id: int
    barrier: int
    start_barrier: int | None

    def read(self, table: str) -> DataFrame:
        """``table`` as of this batch's barrier (lookup joins at the same version)."""
        return self.job.read_at(table, self.barrier)


Transform = Callable[[DataFrame, BatchContext], DataFrame]


class BarrierJob:
    """A registered job: its barrier sources, its sink, and reads at its barriers."""

    def __init__(
        self,
        spark: SparkSession,
        client: MetaServiceClient,
        catalog: Catalog,
        catalog_options: dict[str, str],
        name: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        state_dir: Path,
        reporter: Reporter,
        offline: OfflineBarriers | None = None,
        patience_s: float = 3600.0,
    ) -> None:
        self.spark = spark
        self.client = client
        self.catalog = catalog
        self.catalog_options = catalog_options
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.state_dir = state_dir
        self.reporter = reporter
        self.offline = offline  # source jobs with an outbox: barriers while the service is down
        self.patience_s = patience_s  # how long a batch waits for an unreachable service

    def source(self, table: str) -> DataFrame:
        """A streaming DataFrame of ``table`` whose micro-batches end on the job's barriers."""
        if table not in self.inputs:
            raise BarrierConfigError(
                f"job '{self.name}' does not declare '{table}' as an input; "
                f"add it to inputs= in register() (inputs now: {self.inputs})"
            )
        reader = self.spark.readStream.format(SOURCE_NAME).option("job", self.name)
        for key, value in {**self.catalog_options, "url": self.client.url, "table": table}.items():
            reader = reader.option(key, value)
        return reader.load()

    def sink(
        self,
        table: str | None = None,
        *,
        mode: Mode = "append",
        key_columns: Sequence[str] | None = None,
        transform: Transform | None = None,
    ) -> BarrierSink:
        """The ``foreachBatch`` function that commits each batch to ``table`` at its barrier."""
        table = table or self.outputs[0]
        if table not in self.outputs:
            raise BarrierConfigError(
                f"job '{self.name}' does not write '{table}'; its outputs are {self.outputs}"
            )
        return BarrierSink(self, table, mode, key_columns, transform)

    def start(
        self,
        stream: DataFrame,
        sink: BarrierSink,
        *,
        trigger_seconds: float = 1.0,
        checkpoint: str | None = None,
    ) -> StreamingQuery:
        """Start the streaming query named after the job, checkpointed under the state folder."""
        location = checkpoint or str(self.state_dir / "checkpoint")
        return (
            stream.writeStream.queryName(self.name)
            .option("checkpointLocation", location)
            .trigger(processingTime=f"{trigger_seconds} seconds")
            .foreachBatch(sink)
            .start()
        )

    def table(self, name: str) -> Table:
        return self.catalog.load_table(name)

    def read_at(self, table: str, barrier: int) -> DataFrame:
        return read_at_barrier(self.spark, self.catalog, table, barrier)

    def close(self, timeout: float = 30.0) -> None:
        """Release the job's offline grant, deliver pending reports (waiting up to
        ``timeout``) and close the outbox. Call it once the job's queries have stopped."""
        if self.offline is not None:
            self.offline.close(release=True)
        if not self.reporter.flush(timeout):
            log.warning(
                "job %s: reports still undelivered after %s s stay in its outbox and are "
                "delivered when the job runs again",
                self.name, timeout,
            )  # fmt: skip
        self.reporter.close()


class BarrierSink:
    """foreachBatch(df, batch_id): barrier, exactly-once commit to Iceberg, report."""

    def __init__(
        self,
        job: BarrierJob,
        table: str,
        mode: Mode,
        key_columns: Sequence[str] | None,
        transform: Transform | None,
    ) -> None:
        self.job = job
        self.table = table
        self.mode = mode
        self.key_columns = list(key_columns) if key_columns else None
        self.transform = transform

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        with _in_batch(self.job.name):
            self._run_batch(df, batch_id)

    def _run_batch(self, df: DataFrame, batch_id: int) -> None:
        job = self.job
        iceberg = job.table(self.table)
        done = find_batch_commit(iceberg, job.name, batch_id)
        if done is not None:
            # A replayed batch: its snapshot (and the barrier stamped on it) is the truth.
            log.info(
                "%s batch %d was committed before (snapshot %d); reporting it",
                job.name, batch_id, done.snapshot_id,
            )  # fmt: skip
            self._report(batch_id, done.barrier, done.snapshot_id)
            return
        if job.offline is not None:
            barrier, start = job.offline.barrier_for(batch_id), None
        else:
            answer = self._ask_barrier(batch_id)
            if answer is None:
                return
            barrier, start = answer.barrier, answer.start_barrier
        ctx = BatchContext(job, batch_id, barrier, start)
        rows = self.transform(df, ctx) if self.transform else df
        snapshot = commit_batch(
            rows,
            iceberg,
            barrier=barrier,
            job=job.name,
            batch_id=batch_id,
            mode=self.mode,
            key_columns=self.key_columns,
        )
        self._report(batch_id, barrier, snapshot)

    def _ask_barrier(self, batch_id: int) -> BatchBarrier | None:
        """The MetaService's barrier for the batch, waiting while it is unreachable;
        None for the empty first batch Spark runs when a query starts."""
        job = self.job
        try:
            return retry(  # type: ignore[no-any-return]
                lambda: job.client.batch_barrier(job.name, batch_id),
                job.patience_s,
                "get a batch barrier",
            )
        except ConflictError as exc:
            if exc.code != "no_barrier_ready":
                raise
            # Spark runs a new query's first batch up to the initial offset, which is the
            # barrier the job has already committed: an empty range, nothing to commit.
            log.debug("%s batch %d ends at the committed barrier; skipped", job.name, batch_id)
            return None

    def _report(self, batch_id: int, barrier: int, snapshot: int | None) -> None:
        crash_point("after_commit", batch_id)
        self.job.reporter.report(
            {
                "job": self.job.name,
                "batch_id": batch_id,
                "barrier": barrier,
                "table": self.table,
                "snapshot_id": snapshot,
            }
        )


# Sink calls in progress, by query name (a job's query is named after the job).
_batches_running: dict[str, int] = {}
_batches_lock = threading.Lock()


@contextmanager
def _in_batch(query_name: str) -> Iterator[None]:
    with _batches_lock:
        _batches_running[query_name] = _batches_running.get(query_name, 0) + 1
    try:
        yield
    finally:
        with _batches_lock:
            _batches_running[query_name] -= 1


def _sink_busy(query_name: str) -> bool:
    with _batches_lock:
        return _batches_running.get(query_name, 0) > 0


def stop_between_batches(query: StreamingQuery, timeout: float = 60.0) -> None:
    """Stop ``query`` when its sink is between batches, so no commit is interrupted halfway.

    A query that is behind runs its triggers back to back, so waiting for Spark to be
    idle could wait forever; what matters is that no ``foreachBatch`` call is in the
    middle of a commit. Interrupting one is safe (the next run replays it exactly once)
    but noisy; after ``timeout`` seconds the query is stopped anyway.
    """
    deadline = time.monotonic() + timeout
    while query.isActive and _sink_busy(query.name or "") and time.monotonic() < deadline:
        time.sleep(0.01)
    query.stop()


_listeners: dict[tuple[int, str], BarrierListener] = {}
_listeners_lock = threading.Lock()


def _listener_for(spark: SparkSession, client: MetaServiceClient) -> BarrierListener:
    """One listener per Spark session and MetaService, shared by the jobs registered there."""
    key = (id(spark), client.url)
    with _listeners_lock:
        listener = _listeners.get(key)
        if listener is None:
            listener = BarrierListener(MetaServiceClient(client.url, token=_token(client)))
            spark.streams.addListener(listener)
            _listeners[key] = listener
        return listener


def _token(client: MetaServiceClient) -> str | None:
    auth = client._http.headers.get("Authorization", "")
    return auth.removeprefix("Bearer ") or None


def register(
    spark: SparkSession,
    url: str,
    *,
    job: str,
    inputs: Sequence[str] = (),
    outputs: Mapping[str, StructType | None] | Sequence[str],
    description: str = "",
    catalog_uri: str | None = None,
    warehouse: str | None = None,
    catalog: Catalog | None = None,
    state_dir: str | Path | None = None,
    token: str | None = None,
    outbox: bool = True,
    outbox_options: Mapping[str, Any] | None = None,
    offline: bool = True,
    patience_s: float = 3600.0,
) -> BarrierJob:
    """Register ``job`` with the MetaService and make ``spark`` ready to run it.

    Checks, failing fast with :class:`BarrierConfigError`: the MetaService answers,
    every input table exists in the catalog, and no other job writes the outputs.
    Output tables given with a schema are created when missing. Registers the
    barrier data source and a listener reporting the query's progress.

    ``catalog_uri`` and ``warehouse`` default to the MetaService's own settings
    (``METASERVICE_DB_URL``, ``METASERVICE_WAREHOUSE``): the catalog shares its database.
    Reports go through a durable outbox under ``state_dir`` unless ``outbox=False``
    (``outbox_options``: :class:`spark_barrier.outbox.Outbox` settings such as
    ``max_bytes`` or ``fsync``).
    A source job (no ``inputs``) with an outbox holds an offline grant unless
    ``offline=False``: while the MetaService is unreachable its batches get barriers
    of their own and go on committing (see ``spark_barrier.offline``). Other batches
    wait up to ``patience_s`` for an unreachable MetaService before failing.
    """
    defaults = Settings()
    catalog_options = {
        "catalog_uri": catalog_uri or defaults.db_url,
        "warehouse": str(Path(warehouse or defaults.warehouse).resolve()),
    }
    client = MetaServiceClient(url, token=token)
    _check_reachable(client)
    catalog = catalog or open_catalog(catalog_options["catalog_uri"], catalog_options["warehouse"])
    output_names = list(outputs)
    _check_inputs(catalog, job, inputs)
    _ensure_outputs(catalog, outputs)
    try:
        client.put_job(job, inputs=inputs, outputs=output_names, description=description)
    except ConflictError as exc:
        raise BarrierConfigError(f"MetaService refused job '{job}': {exc.message}") from exc
    except ApiError as exc:
        raise BarrierConfigError(f"MetaService refused job '{job}': {exc.message}") from exc
    spark.dataSource.register(BarrierSource)
    _listener_for(spark, client).jobs.add(job)
    state = Path(state_dir or "spark-barrier-state") / job
    state.mkdir(parents=True, exist_ok=True)
    reporter: Reporter
    offline_barriers = None
    if outbox:
        outbox_reporter = OutboxReporter(client, state / "outbox", **(outbox_options or {}))
        if offline and not inputs:
            offline_barriers = OfflineBarriers(client, job, outbox_reporter.outbox, state)
            offline_barriers.report_in()  # reachable: _check_reachable passed
        reporter = outbox_reporter
    else:
        reporter = DirectReporter(client, give_up_after_s=patience_s)
    log.info("job '%s' registered: inputs %s, outputs %s", job, list(inputs), output_names)
    return BarrierJob(
        spark,
        client,
        catalog,
        catalog_options,
        job,
        inputs,
        output_names,
        state,
        reporter,
        offline=offline_barriers,
        patience_s=patience_s,
    )


def _check_reachable(client: MetaServiceClient) -> None:
    try:
        client.list_jobs(limit=1)
    except Unavailable as exc:
        raise BarrierConfigError(
            f"the MetaService at {client.url} is unreachable ({exc.__cause__ or exc}); "
            "start it with `metaservice start` or pass the right url"
        ) from exc


def _check_inputs(catalog: Catalog, job: str, inputs: Sequence[str]) -> None:
    for name in inputs:
        if not catalog.table_exists(name):
            raise BarrierConfigError(
                f"input table '{name}' of job '{job}' does not exist in the catalog; "
                "register the job that writes it first (with its schema), or fix the name"
            )


def _ensure_outputs(
    catalog: Catalog, outputs: Mapping[str, StructType | None] | Sequence[str]
) -> None:
    schemas: Mapping[str, Any] = outputs if isinstance(outputs, Mapping) else dict.fromkeys(outputs)
    for name, schema in schemas.items():
        if catalog.table_exists(name):
            continue
        if schema is None:
            raise BarrierConfigError(
                f"output table '{name}' does not exist; pass its schema: outputs={{'{name}': StructType(...)}}"
            )
        ensure_table(catalog, name, schema)
