"""The barrier-aligned streaming source: a Spark 4 Python data source whose offsets are barriers.

    spark.readStream.format("metaservice_barrier")
        .option("url", "http://127.0.0.1:8765").option("job", "build_order_detail")
        .option("table", "ods.orders")
        .option("catalog_uri", "sqlite:///warehouse/metaservice.db")
        .option("warehouse", "warehouse")
        .load()

Every barrier source of one job reports the job's aligned target
(``GET /jobs/{job}/next-barrier``) as its latest offset; the MetaService keeps
that target fixed until the job commits it, so all inputs of a batch end at the
same barrier. A batch from barrier ``a`` to ``b`` reads the data files added by
the table's snapshots in (snapshot_at(a), snapshot_at(b)], one Spark partition
per file, read on the executors with pyarrow.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

log = logging.getLogger("spark_barrier.source")

SOURCE_NAME = "metaservice_barrier"
_REQUIRED = ("url", "job", "table", "catalog_uri", "warehouse")


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
        self.columns = [f.name for f in schema.fields]
        self._client: Any = None
        self._table: Any = None
        self._latest: int | None = None  # the last offset reported, kept while offline
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
        self._latest = self._ms().get_job(self.options["job"]).frontier
        return {"barrier": self._latest}

    # The zero-argument form on purpose: every PySpark 4.x calls it (4.2+ also
    # offers latestOffset(start, limit) for admission control, which we don't need).
    def latestOffset(self) -> dict[str, int]:  # type: ignore[override]
        from metaservice.client import Unavailable

        try:
            self._latest = self._ms().next_barrier(self.options["job"]).barrier
        except Unavailable as exc:
            # No new target without the MetaService: no new batch until it is back.
            if self._latest is None:
                raise
            if not self._unavailable_logged:
                log.warning("job %s waits for the MetaService: %s", self.options["job"], exc)
                self._unavailable_logged = True
            return {"barrier": self._latest}
        self._unavailable_logged = False
        return {"barrier": self._latest}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        from spark_barrier.snapshots import appended_files, snapshot_at

        table = self._iceberg()
        after = snapshot_at(table, int(start["barrier"]))
        upto = snapshot_at(table, int(end["barrier"]))
        files = appended_files(table, after, upto)
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
