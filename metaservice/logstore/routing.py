"""Which of a table's log services a row goes to, when its log is spread over several.

A table's external log may be several log services (``register(..., log="external",
log_url=["http://a:7070", "http://b:7070"])``). Each row goes to one of them, chosen by
the row's partition under the table's partition spec, so one partition's rows always
reach the same service:

- a spec with a ``bucket[N]`` field: the service is the bucket number modulo the number
  of services (the first bucket field's). Buckets are the table's own unit of spread, so
  with N a multiple of the services each service gets the same number of buckets, and
  an operator can tell which service holds a bucket without running any code;
- any other spec (identity, year/month/day/hour, truncate): Iceberg's 32-bit murmur3
  hash (the hash of its bucket transform, fixed by the Iceberg spec) of each partition
  value, combined over the fields, modulo the number of services.

Both depend only on the partition values, the spec and the number of services (no
process seed: Python's ``hash`` of a string changes with every interpreter), so the
routing is the same on every executor and across restarts. An unpartitioned table has
one partition, so a log of several services is refused for it (:func:`check_routable`).
Readers do not need the routing: they merge every service's log (see
:class:`~metaservice.logstore.reader.LogReader`).

Needs pyarrow and pyiceberg (with pyiceberg-core for the transforms); imported only by
writers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

__all__ = ["NotRoutable", "Routing", "check_routable", "routing_of"]

# The hash's range: Iceberg's bucket transform over this many buckets is murmur3 & MAX_INT
# modulo it, i.e. the murmur3 hash itself (made non-negative).
_HASH_SPACE = 2**31 - 1
_MIX = 31  # combining several fields' hashes, as Java's Arrays.hashCode does


class NotRoutable(ValueError):
    """A table whose rows cannot be spread over several log services (unpartitioned)."""


@dataclass(frozen=True)
class Routing:
    """The routing of one table's rows over ``services`` log services; pickles small (the
    spec and schema as JSON) into the executors' write tasks."""

    services: int
    spec_json: str
    schema_json: str

    @functools.cached_property
    def _spec(self) -> tuple[PartitionSpec, Schema]:
        from pyiceberg.partitioning import PartitionSpec
        from pyiceberg.schema import Schema

        return (
            PartitionSpec.model_validate_json(self.spec_json),
            Schema.model_validate_json(self.schema_json),
        )

    def service_of(self, rows: pa.Table) -> pa.Array:
        """Each row's service, 0 .. services - 1 (int64)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyiceberg.transforms import BucketTransform

        spec, schema = self._spec
        if self.services == 1 or not spec.fields:
            return pa.array([0] * rows.num_rows, pa.int64())
        values = []
        for field in spec.fields:
            source = schema.find_field(field.source_id)
            column = rows.column(schema.find_column_name(field.source_id) or source.name)
            value = field.transform.pyarrow_transform(source.field_type)(column)
            if isinstance(field.transform, BucketTransform):
                # The bucket number itself: buckets spread evenly over the services.
                bucket = pc.fill_null(pc.cast(value, pa.int64()), 0)
                return pc.subtract(
                    bucket, pc.multiply(pc.divide(bucket, self.services), self.services)
                )
            hashed = _hash(value, field.transform.result_type(source.field_type))
            values.append(pc.fill_null(pc.cast(hashed, pa.int64()), 0))
        combined = values[0]
        for hashed in values[1:]:  # stays below 2**37: no overflow in int64
            combined = pc.add(pc.multiply(_remainder(combined, _HASH_SPACE), _MIX), hashed)
        return _remainder(combined, self.services)

    def split(self, rows: pa.Table) -> list[tuple[int, pa.Table]]:
        """The rows of each service that gets any, in the rows' order: ``(service, rows)``."""
        import pyarrow.compute as pc

        if self.services == 1:
            return [(0, rows)] if rows.num_rows else []
        services = self.service_of(rows)
        parts = []
        for service in range(self.services):
            mine = rows.filter(pc.equal(services, service))
            if mine.num_rows:
                parts.append((service, mine))
        return parts


def _remainder(values: pa.Array, divisor: int) -> pa.Array:
    import pyarrow.compute as pc

    return pc.subtract(values, pc.multiply(pc.divide(values, divisor), divisor))


def _hash(value: pa.Array, iceberg_type: object) -> pa.Array:
    """Iceberg's murmur3 hash of each value (its bucket transform over the whole range)."""
    import pyarrow as pa
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import IcebergType, StringType

    assert isinstance(iceberg_type, IcebergType)
    bucket: BucketTransform[object] = BucketTransform(_HASH_SPACE)
    if bucket.can_transform(iceberg_type):
        return bucket.pyarrow_transform(iceberg_type)(value)
    # Types Iceberg does not bucket (float, double, boolean): their text.
    return bucket.pyarrow_transform(StringType())(value.cast(pa.string()))


def check_routable(name: str, table: Table, services: int) -> None:
    """Refuse (:class:`NotRoutable`) a log of several services for an unpartitioned table."""
    if services > 1 and not table.spec().fields:
        raise NotRoutable(
            f"table {name} is not partitioned, so its rows cannot be spread over "
            f"{services} log services (each row goes to its partition's); give it one "
            "log service, or partition it (partition_by=)"
        )


def routing_of(name: str, table: Table, services: int) -> Routing:
    """How ``table``'s rows (written with its current spec) go to ``services`` services."""
    check_routable(name, table, services)
    return Routing(services, table.spec().model_dump_json(), table.schema().model_dump_json())
