"""The batch context: what a sink's ``transform`` knows about the batch it runs in
(:class:`BatchContext`: its barriers, its streamed inputs' rows, ``ctx.read`` of a table
as of the batch's barrier), and the ``Transform`` signature that receives it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame

from spark_barrier.errors import BarrierConfigError

if TYPE_CHECKING:
    from spark_barrier.job import BarrierJob


@dataclass
class BatchContext:
    """What a transform knows about the batch it runs in."""

    job: BarrierJob
    batch_id: int
    barrier: int
    start_barrier: int | None
    leases: list[str] = field(default_factory=list)  # taken by read(), released after the batch
    # A derived batch's rows of each streamed input (job.source(table)), by table.
    inputs: dict[str, DataFrame] = field(default_factory=dict)

    def input(self, table: str) -> DataFrame:
        """This batch's rows of the streamed input ``table``: what ``job.source(table)``
        streams in ``(start_barrier, barrier]`` (its changes with ``_change_type`` for
        ``changelog=True``), without the ``_table`` column a batch of several inputs has.

        >>> def join(rows, ctx):  # doctest: +SKIP
        ...     return ctx.input("ods.orders").join(ctx.input("ods.payments"), "order_id")
        """
        table = self.job.actual(table)
        if table not in self.inputs:
            raise BarrierConfigError(
                f"job '{self.job.name}' batch {self.batch_id} streams no input '{table}' "
                f"(it streams {sorted(self.inputs)}): build the query's stream from "
                f"job.source('{table}'), or read the table with ctx.read('{table}')"
            )
        return self.inputs[table]

    def read(self, table: str) -> DataFrame:
        """``table`` as of this batch's barrier, for lookup joins at the same version.

        Only a declared input or lookup table (``register(..., lookups=[...])``) of a
        derived job. Waits (up to the job's ``patience_s``) until the table is exact at
        the barrier, and keeps the snapshot read from expiry (a lease) until the batch
        has committed. An output of the job itself reads as before this batch (at its
        start barrier, where the job committed last): running totals and the like.

        >>> def enrich(orders, ctx):  # doctest: +SKIP
        ...     return orders.join(ctx.read("ods.items"), "item_id")
        """
        return self.job.read_in_batch(self, table)

    def release(self) -> None:
        """Give back what :meth:`read` kept in use (the sink calls it when the batch ends)."""
        while self.leases:
            self.job.release_lease(self.leases.pop())


Transform = Callable[[DataFrame, BatchContext], DataFrame]
