"""What a derived batch reads from its streamed inputs: planned on the driver (files
only), read by Spark's native Parquet reader on the executors.

The barrier source (:mod:`spark_barrier.source`) only gives Spark its offsets; no
input row passes through a Python worker. The sink knows the batch's barriers
``(a, b]`` from Spark's plan and the snapshot range of each input from the
MetaService, and reads, per streamed input:

- ``job.source(table)``: the rows the snapshots in the range added (the range must be
  append-only, else :class:`~spark_barrier.iceberg.scan.NotAppendOnly`);
- ``job.source(table, changelog=True)``: the range's net changes with a
  ``_change_type`` column (:mod:`spark_barrier.iceberg.changelog`);

or, for a first read (no start snapshot), the table's state at the range's end.
One streamed input gives the batch that input's rows; several give their union by
column name (columns missing from an input are null) with a ``_table`` column naming
the input of each row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce

from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from metaservice.barriers.schemas import InputRange
from spark_barrier.iceberg.changelog import ChangelogFiles, changelog_files, read_changelog
from spark_barrier.iceberg.read import read_files
from spark_barrier.iceberg.scan import range_file_paths

TABLE_COLUMN = "_table"  # names the input of each row when a batch streams several

# Options of the barrier source that say how the sink reads the input (the source
# itself ignores them; the sink finds them in Spark's plan of the batch).
_OPTION_CHANGELOG = "changelog"
_OPTION_CHANGELOG_KEYS = "changelog_keys"


@dataclass(frozen=True)
class StreamedInput:
    """How a job streams one input: its rows, or its changelog keyed by ``keys``."""

    table: str
    changelog: bool = False
    keys: tuple[str, ...] = ()  # changelog keys; () = the table's identifier fields

    def options(self) -> dict[str, str]:
        """The source options that carry this to the sink."""
        options = {"table": self.table}
        if self.changelog:
            options[_OPTION_CHANGELOG] = "true"
        if self.keys:
            options[_OPTION_CHANGELOG_KEYS] = json.dumps(list(self.keys))
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> StreamedInput:
        keys = json.loads(options.get(_OPTION_CHANGELOG_KEYS, "[]"))
        return cls(
            table=options["table"],
            changelog=options.get(_OPTION_CHANGELOG, "false").lower() == "true",
            keys=tuple(str(k) for k in keys),
        )


@dataclass(frozen=True)
class InputPlan:
    """The files one input's part of a batch reads (planned on the driver)."""

    table: str
    files: list[str] = field(default_factory=list)  # a row read
    changes: ChangelogFiles | None = None  # a changelog read
    keys: tuple[str, ...] = ()  # a changelog read's key columns


def table_keys(table: Table) -> tuple[str, ...]:
    """The table's key columns: its Iceberg identifier fields (CDC sinks set them)."""
    schema = table.schema()
    return tuple(schema.find_column_name(i) or str(i) for i in schema.identifier_field_ids)


def check_changelog_keys(table: Table, keys: Sequence[str]) -> None:
    missing = sorted(set(keys) - {f.name for f in table.schema().fields})
    if missing:
        name = ".".join(table.name())
        raise ValueError(
            f"changelog_keys {missing} are not columns of table {name}; "
            f"its columns are {[f.name for f in table.schema().fields]}"
        )


def plan_input(table: Table, streamed: StreamedInput, span: InputRange) -> InputPlan:
    """What ``streamed`` reads for the snapshot range ``span`` (driver: files only)."""
    after, upto = span.from_snapshot, span.to_snapshot
    if not streamed.changelog:
        return InputPlan(streamed.table, files=range_file_paths(table, after, upto))
    keys = streamed.keys or table_keys(table)
    return InputPlan(streamed.table, changes=changelog_files(table, after, upto), keys=keys)


def read_input(spark: SparkSession, table: Table, plan: InputPlan) -> DataFrame:
    """The rows ``plan`` names, read by Spark's native Parquet reader."""
    if plan.changes is None:
        return read_files(spark, table, plan.files)
    return read_changelog(spark, table, plan.changes, plan.keys)


def batch_frame(frames: Mapping[str, DataFrame]) -> DataFrame:
    """The DataFrame a transform gets: one input's rows, or several inputs' rows by name
    with a ``_table`` column."""
    if len(frames) == 1:
        (frame,) = frames.values()
        return frame
    labelled = [f.withColumn(TABLE_COLUMN, F.lit(name)) for name, f in sorted(frames.items())]
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), labelled)
