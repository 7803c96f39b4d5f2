"""The barrier-aligned streaming source: a Spark 4 Python data source whose offsets are barriers.

    spark.readStream.format("metaservice_barrier")
        .option("url", "http://127.0.0.1:8765").option("job", "build_order_detail")
        .option("table", "ods.orders")
        .option("catalog", '{"type": "sql", "uri": "sqlite:///ms.db", "warehouse": "s3://b/wh"}')
        .load()

One end per batch: a batch's end is a function of its start. Every barrier source
of a job asks for the end of the batch starting after its start offset ``a``
(``GET /jobs/{job}/next-barrier?after=a&source=table``); the MetaService gives the
same ``b`` for the same ``a`` once one is ready, and keeps a "not ready" answer
until the same source asks again, so all inputs of a batch end at the same barrier.

One barrier stream per job, not one per input: a ready end is final for its start,
so the first source of a trigger to get one writes it to a file in the job's state
folder (option ``shared_ends``; each source runs in a Python worker of its own on the
driver), and the job's other sources starting at the same ``a`` answer it from there
without asking. A "not ready" is never shared: each source asks, and the service's
round keeps the sources of one trigger agreeing.

It only gives Spark offsets: a batch's partitions are one empty partition, and no
input row ever passes through a Python worker. The batch's rows are read by the
sink (``spark_barrier.sink.BarrierSink``), which knows the planned ``(a, b]`` from
Spark's plan: it plans the files of each input's snapshot range (the MetaService's
mapping of those barriers, not the stamps on the table, which a late zombie commit
could change) and Spark's native Parquet reader reads them on the executors
(``spark_barrier.inputs``). The schema is still the table's, so the stream can be
unioned with other inputs' streams; options such as ``changelog`` are read by the
sink from the plan.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

from spark_barrier.errors import swapped_message

log = logging.getLogger("spark_barrier.source")

SOURCE_NAME = "metaservice_barrier"
# "catalog": the pyiceberg properties of the tables' catalog, as JSON (one option, so
# the driver and every executor load the same catalog).
_REQUIRED = ("url", "job", "table", "catalog")
# How long latestOffset retries an unreachable MetaService before answering "no new
# batch" (its start). Retrying first makes it unlikely that one source of a trigger
# got an end while another could not ask; the sink refuses such a batch loudly.
UNAVAILABLE_WAIT_S = 10.0
SWAP_CHECK_EVERY_S = 5.0
# A shared end older than this is not used (the sources of one trigger ask within
# moments of each other; an old file may be another run's).
SHARED_END_TTL_S = 60.0


class NoRows(InputPartition):
    """The one partition of every batch: the sink reads the rows (module docstring)."""

    def __init__(self) -> None:
        super().__init__(None)


def _require(options: dict[str, str]) -> dict[str, str]:
    missing = [k for k in _REQUIRED if not options.get(k)]
    if missing:
        raise ValueError(
            f"the {SOURCE_NAME} source needs the options {', '.join(missing)}; "
            "use spark_barrier.register(...).source(table) to set them for you"
        )
    return options


def open_catalog_of(options: dict[str, str]) -> Any:
    """The tables' catalog, from a source's ``catalog`` option (and ``catalog_name``)."""
    import json

    from spark_barrier.iceberg.catalog import CATALOG_NAME, load_catalog

    properties = json.loads(options["catalog"])
    return load_catalog(properties, name=options.get("catalog_name", CATALOG_NAME))


def _open_table(options: dict[str, str]) -> Any:
    return open_catalog_of(options).load_table(options["table"])


class BarrierSource(DataSource):
    """Registered by ``spark_barrier.register``; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        from spark_barrier.iceberg.schemas import iceberg_schema_to_spark

        table = _open_table(_require(dict(self.options)))
        return iceberg_schema_to_spark(table.schema())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return BarrierStreamReader(_require(dict(self.options)), schema)


class BarrierStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.job = options["job"]
        self.table_name = options["table"]
        self.patience_s = float(options.get("patience_s", "3600"))
        # next-barrier long poll: how long one call may wait for the batch to be ready.
        self.wait_ms = int(options.get("wait_ms", "0"))
        # A revision job's source of a mirror: while idle, it looks every
        # SWAP_CHECK_EVERY_S whether the revision was swapped (the mirror renamed), since
        # an idle query never loads the mirror and would not notice otherwise.
        self.revision = int(options["revision"]) if "revision" in options else None
        self._swap_checked = 0.0
        self._client: Any = None
        self._unavailable_logged = False
        shared = options.get("shared_ends")
        self.shared_ends = Path(shared) if shared else None

    # Driver side: offsets are {"barrier": int}. ------------------------------
    def _ms(self) -> Any:
        if self._client is None:
            from metaservice.client import MetaServiceClient

            self._client = MetaServiceClient(self.options["url"], token=self.options.get("token"))
        return self._client

    def initialOffset(self) -> dict[str, int]:
        # A new query starts where the job has committed up to (0 for a new job).
        from spark_barrier.report import retry

        job = retry(lambda: self._ms().get_job(self.job), self.patience_s, "read the job")
        return {"barrier": job.frontier}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """The end of the batch starting after ``start`` (``start`` itself: no batch yet).

        Admission control (PySpark >= 4.2): Spark passes the start, so the end asked
        for is the one of this batch, not whatever the job's target is by now.
        """
        from metaservice.client import ConflictError, Unavailable
        from spark_barrier.report import retry

        after = int(start["barrier"])
        shared = self._shared_end(after)
        if shared is not None:
            return {"barrier": shared}
        try:
            answer = retry(
                lambda: self._ms().next_barrier(
                    self.job, after=after, source=self.table_name, wait_ms=self.wait_ms
                ),
                UNAVAILABLE_WAIT_S,
                f"ask the next barrier of job {self.job}",
            )
        except ConflictError as exc:
            if exc.code == "superseded":
                raise RuntimeError(
                    f"job {self.job} was replaced by a revision ({exc.message}); the query "
                    "stops: run the revision's job instead (metaservice revision status)"
                ) from exc
            raise
        except Unavailable as exc:
            # No new end without the MetaService: no new batch until it is back.
            if not self._unavailable_logged:
                log.warning("job %s waits for the MetaService: %s", self.job, exc)
                self._unavailable_logged = True
            return {"barrier": after}
        self._unavailable_logged = False
        if answer.barrier == after:
            self._stop_if_swapped()
        if answer.barrier < after:
            raise RuntimeError(
                f"the MetaService answered barrier {answer.barrier} for job {self.job}'s "
                f"batch after {after}: barriers never go back"
            )
        if answer.ready and answer.barrier > after:
            self._share_end(after, answer.barrier)
        return {"barrier": answer.barrier}

    def _shared_end(self, after: int) -> int | None:
        """The ready end another source of the job got for the batch after ``after``."""
        if self.shared_ends is None:
            return None
        try:
            doc = json.loads(self.shared_ends.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("job") != self.job or doc.get("after") != after:
            return None
        end, at = doc.get("barrier"), doc.get("at")
        if not isinstance(end, int) or end <= after or not isinstance(at, (int, float)):
            return None
        return end if 0 <= time.time() - at < SHARED_END_TTL_S else None

    def _share_end(self, after: int, end: int) -> None:
        if self.shared_ends is None:
            return
        doc = {"job": self.job, "after": after, "barrier": end, "at": time.time()}
        tmp = self.shared_ends.with_name(f"{self.shared_ends.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self.shared_ends)  # readers see the old answer or the new one
        except OSError as exc:
            log.debug("job %s could not share its next end: %s", self.job, exc)

    def _stop_if_swapped(self) -> None:
        if self.revision is None or time.monotonic() - self._swap_checked < SWAP_CHECK_EVERY_S:
            return
        self._swap_checked = time.monotonic()
        if self._ms().get_revision(self.revision).state == "swapped":
            raise RuntimeError(
                "revision_swapped: " + swapped_message(self.job, self.revision, [self.table_name])
            )

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        # The offsets are all Spark needs from this source; the sink reads the rows.
        return [NoRows()]

    def commit(self, end: dict[str, int]) -> None:
        # The sink reports the commit; nothing to release here.
        pass

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        # Never asked for rows in practice (the sink ignores the stream's DataFrame);
        # if something does read it, it is empty rather than wrong.
        return iter(())
