"""The barrier-aligned streaming source: a Spark 4 Python data source whose offsets are barriers.

    spark.readStream.format("metaservice_barrier")
        .option("url", "http://127.0.0.1:8765").option("job", "build_order_detail")
        .option("table", "ods.orders")
        .option("catalog_uri", "sqlite:///warehouse/metaservice.db")
        .option("warehouse", "warehouse")
        .load()

One end per batch: a batch's end is a function of its start. Every barrier source
of a job asks for the end of the batch starting after its start offset ``a``
(``GET /jobs/{job}/next-barrier?after=a&source=table``); the MetaService gives the
same ``b`` for the same ``a`` once one is ready, and keeps a "not ready" answer
until the same source asks again, so all inputs of a batch end at the same barrier.

A batch ``(a, b]`` reads, per input, the snapshot range the MetaService maps those
barriers to (``GET /jobs/{job}/ranges``; not the stamps on the table, which a late
zombie commit could change): the data files added by the snapshots in
``(from, to]``, refused with a clear error if the range replaces or deletes rows
(``iceberg_io.NotAppendOnly``), or the table's full state at ``to`` when the start
snapshot does not exist (a new reader, or a start that was expired since). One
Spark partition per file, read on the executors with pyarrow.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

log = logging.getLogger("spark_barrier.source")

SOURCE_NAME = "metaservice_barrier"
_REQUIRED = ("url", "job", "table", "catalog_uri", "warehouse")
# How long latestOffset retries an unreachable MetaService before answering "no new
# batch" (its start). Retrying first makes it unlikely that one source of a trigger
# got an end while another could not ask; the sink refuses such a batch loudly.
UNAVAILABLE_WAIT_S = 10.0


@dataclass
class FilePartition(InputPartition):
    path: str | None

    def __init__(self, path: str | None) -> None:
        super().__init__(path)
        self.path = path


def _require(options: dict[str, str]) -> dict[str, str]:
    missing = [k for k in _REQUIRED if not options.get(k)]
    if missing:
        raise ValueError(
            f"the {SOURCE_NAME} source needs the options {', '.join(missing)}; "
            "use spark_barrier.register(...).source(table) to set them for you"
        )
    return options


def _open_table(options: dict[str, str]) -> Any:
    from spark_barrier.iceberg_io import open_catalog

    catalog = open_catalog(
        options["catalog_uri"],
        options["warehouse"],
        name=options.get("catalog_name", "metaservice"),
    )
    return catalog.load_table(options["table"])


class BarrierSource(DataSource):
    """Registered by ``spark_barrier.register``; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        from spark_barrier.iceberg_io import iceberg_schema_to_spark

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
        self.columns = [f.name for f in schema.fields]
        self._client: Any = None
        self._table: Any = None
        self._unavailable_logged = False

    # Driver side: offsets are {"barrier": int}. ------------------------------
    def _ms(self) -> Any:
        if self._client is None:
            from metaservice.client import MetaServiceClient

            self._client = MetaServiceClient(self.options["url"], token=self.options.get("token"))
        return self._client

    def _iceberg(self) -> Any:
        if self._table is None:
            self._table = _open_table(self.options)
        else:
            self._table.refresh()
        return self._table

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
        from metaservice.client import Unavailable
        from spark_barrier.report import retry

        after = int(start["barrier"])
        try:
            answer = retry(
                lambda: self._ms().next_barrier(self.job, after=after, source=self.table_name),
                UNAVAILABLE_WAIT_S,
                f"ask the next barrier of job {self.job}",
            )
        except Unavailable as exc:
            # No new end without the MetaService: no new batch until it is back.
            if not self._unavailable_logged:
                log.warning("job %s waits for the MetaService: %s", self.job, exc)
                self._unavailable_logged = True
            return {"barrier": after}
        self._unavailable_logged = False
        if answer.barrier < after:
            raise RuntimeError(
                f"the MetaService answered barrier {answer.barrier} for job {self.job}'s "
                f"batch after {after}: barriers never go back"
            )
        return {"barrier": answer.barrier}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        from spark_barrier.iceberg_io import range_file_paths
        from spark_barrier.report import retry

        after, upto = int(start["barrier"]), int(end["barrier"])
        if after == upto:
            return [FilePartition(None)]
        ranges = retry(
            lambda: self._ms().input_ranges(self.job, after=after, to=upto),
            self.patience_s,
            f"read job {self.job}'s input ranges",
        )
        mine = [r for r in ranges if r.table == self.table_name]
        if len(mine) != 1:
            raise RuntimeError(
                f"the MetaService gave job {self.job} no range of '{self.table_name}' for "
                f"barriers ({after}, {upto}]: is it still an input of the job?"
            )
        files = range_file_paths(self._iceberg(), mine[0].from_snapshot, mine[0].to_snapshot)
        return [FilePartition(path) for path in files] or [FilePartition(None)]

    def commit(self, end: dict[str, int]) -> None:
        # The sink reports the commit; nothing to release here.
        pass

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()

    # Executor side. ----------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, FilePartition)
        if partition.path is None:
            return
        import pyarrow.parquet as pq
        from pyarrow import fs

        filesystem, path = fs.FileSystem.from_uri(partition.path)
        with filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            present = set(parquet.schema_arrow.names)
            for batch in parquet.iter_batches(batch_size=65_536):
                yield _conform(batch, self.columns, present)


def _conform(batch: Any, columns: list[str], present: set[str]) -> Any:
    """Columns in the table's order; a column added after the file was written reads as null."""
    import pyarrow as pa

    arrays = [
        batch.column(name) if name in present else pa.nulls(batch.num_rows) for name in columns
    ]
    return pa.RecordBatch.from_arrays(arrays, names=columns)
