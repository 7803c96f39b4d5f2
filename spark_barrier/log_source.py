"""``read_log``: a streaming DataFrame of a table's log store (at-least-once, within seconds).

    rows = spark_barrier.read_log(spark, "http://127.0.0.1:8765", "ods.orders")
    rows.writeStream.format("console").start()

Each micro-batch holds the rows that reached the table's log (or, while the reader is
far behind or the log is down, the table's snapshots) since the previous one, with
three more columns: ``_log_barrier``, ``_log_batch`` (the writing batch) and
``_log_seq`` (the log's sequence number; null for rows read from a snapshot). A row
may come twice (after a writer's restart, or when a reader switches between the log
and the snapshots), never not at all. See :class:`metaservice.logstore.LogReader`.

A Spark 4 Python data source with a simple stream reader: it reads on the driver,
so it is meant for the second-level, modest-volume feeds a log serves. Its offset is
the reader's position (snapshot, batch and the job whose batch it is, and each log
service's epoch and sequence by address: a table's log may be several services), so a batch Spark replays after a restart is read again from where it started.
An offset written before the job was part of it reads the job from the snapshot's stamp.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.types import LongType, StructField, StructType

from spark_barrier.source import open_catalog_of

LOG_SOURCE_NAME = "metaservice_log"
_POSITION = ("committed_snapshot", "committed_batch", "committed_job", "logs")


def read_log(
    spark: SparkSession,
    url: str,
    table: str,
    *,
    catalog_properties: Mapping[str, str] | None = None,
    token: str | None = None,
    start: str = "latest",
) -> DataFrame:
    """Follow ``table``'s log (see the module docstring). ``url`` is the MetaService's,
    where the table's writer published its log; ``catalog_properties`` load the table
    for the snapshots (default: the MetaService's SQL catalog, as ``register``'s);
    ``start``: "latest" (what comes after the table's current snapshot) or "earliest"
    (the table's current state first). A table without a log is refused at once, with
    how to enable it."""
    from metaservice.client import MetaServiceClient
    from metaservice.logstore import log_address
    from spark_barrier.registration import _catalog_properties

    if start not in ("latest", "earliest"):
        raise ValueError(f'start={start!r}: use "latest" or "earliest"')
    with MetaServiceClient(url, token=token) as client:
        log_address(client, table)  # LogNotEnabled, with how to enable it
    properties = _catalog_properties("read_log", catalog_properties, None, None, None)
    spark.dataSource.register(LogSource)
    options = {"url": url, "table": table, "catalog": json.dumps(properties), "start": start}
    if token:
        options["token"] = token
    return spark.readStream.format(LOG_SOURCE_NAME).options(**options).load()


class LogSource(DataSource):
    """Registered by :func:`read_log`; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return LOG_SOURCE_NAME

    def schema(self) -> StructType:
        from metaservice.logstore import wire
        from spark_barrier.iceberg.schemas import iceberg_schema_to_spark

        table = open_catalog_of(dict(self.options)).load_table(self._table)
        rows = iceberg_schema_to_spark(table.schema())
        offsets = [StructField(c, LongType(), True) for c in wire.OFFSET_COLUMNS]
        return StructType([*rows.fields, *offsets])

    @property
    def _table(self) -> str:
        return str(self.options["table"])

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return LogStreamReader(dict(self.options), schema)


class LogStreamReader(SimpleDataSourceStreamReader):
    """Reads on the driver with one :class:`LogReader`, set to each batch's start."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.columns = schema.fieldNames()
        self._reader: Any = None
        self._initial: dict[str, Any] | None = None

    def _log_reader(self) -> Any:
        if self._reader is None:
            from metaservice.client import MetaServiceClient
            from metaservice.logstore import LogReader

            table = self.options["table"]
            # Kept open: the reader asks it where the log is after the log went down.
            ms = MetaServiceClient(self.options["url"], token=self.options.get("token"))
            self._reader = LogReader.from_metaservice(
                table,
                ms,
                catalog=open_catalog_of(self.options),
                start=self.options.get("start", "latest"),
                reader_id=f"read_log-{table}",
            )
        return self._reader

    def initialOffset(self) -> dict[str, Any]:
        # Spark may ask again after reads moved the reader: the start stays where it was.
        if self._initial is None:
            self._initial = _position(self._log_reader()) | {"source": "snapshots"}
        return self._initial

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[Any, ...]], dict[str, Any]]:
        reader = self._log_reader()
        _seek(reader, start)
        rows = reader.poll()
        end = _position(reader) | {"source": reader.source}
        return self._tuples(rows), end

    def readBetweenOffsets(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> Iterator[tuple[Any, ...]]:
        """A replayed batch: read again from its start, up to its end's position
        (at-least-once: a log reset in between gives the snapshots' rows instead)."""
        reader = self._log_reader()
        _seek(reader, start)
        parts = []
        for _ in range(1000):  # each poll moves the position; the end is a few polls away
            rows = reader.poll()
            if rows is not None:
                parts.append(rows)
            if rows is None or _reached(reader, end):
                break
        return iter([row for part in parts for row in self._tuples(part)])

    def _tuples(self, rows: Any) -> Iterator[tuple[Any, ...]]:
        # A list's iterator, not a generator: Spark pickles what read() returns.
        if rows is None:
            return iter([])
        names = [c for c in self.columns if c in rows.column_names]
        data = rows.select(names).to_pylist()
        return iter([tuple(row.get(c) for c in self.columns) for row in data])


def _position(reader: Any) -> dict[str, Any]:
    here = {name: getattr(reader, name) for name in _POSITION if name != "logs"}
    # Each log service's (epoch, seq), by address: a log may be several services.
    here["logs"] = {url: list(position) for url, position in sorted(reader.positions.items())}
    return here


def _seek(reader: Any, offset: dict[str, Any]) -> None:
    for name in _POSITION:
        if name != "logs":
            setattr(reader, name, offset.get(name))
    logs = offset.get("logs")
    if logs is None and offset.get("seq") is not None and len(reader.addresses) == 1:
        # An offset written before a log could be several services: its one (epoch, seq).
        logs = {reader.addresses[0]: [offset["epoch"], offset["seq"]]}
    reader.positions = {url: (int(p[0]), int(p[1])) for url, p in (logs or {}).items()}
    reader.source = offset.get("source", "snapshots")


def _reached(reader: Any, end: dict[str, Any]) -> bool:
    here = _position(reader)
    if "logs" not in end and "seq" in end:  # an older end: one log's epoch and seq
        (position,) = here["logs"].values() or [[None, None]]
        here |= {"epoch": position[0], "seq": position[1]}
    # An end written before committed_job was kept lacks it: the other keys place it.
    return all(here[k] == end[k] for k in (*_POSITION, "epoch", "seq") if k in end)
