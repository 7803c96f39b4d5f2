"""What a barrier job tells its caller when it cannot go on: the job's two errors and the
message of a revision driver that ran through its revision's swap.

Their own module, importing nothing of the package, so that every module that raises
them (``job``, ``log``, ``source``, the sinks) imports them at the top without importing
``job``, which imports those modules in turn. ``spark_barrier`` exports both errors.
"""

from __future__ import annotations

from collections.abc import Sequence


class BarrierConfigError(Exception):
    """The job cannot run as configured; the message says what to change."""


class BarrierBatchError(Exception):
    """A batch cannot run as Spark planned it; nothing of it was committed. Raised from
    ``foreachBatch``, it stops the query; the message says what happened and what to do.

    ``code``: the MetaService's reason when it refused the batch (``query_reset``,
    ``batch_plan_mismatch``, ``batch_abandoned``...), else a reason of the sink's own.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def swapped_message(job: str, revision: int, tables: Sequence[str]) -> str:
    """What a revision driver that ran through its revision's swap is told."""
    return (
        f"job '{job}': revision {revision} was swapped while this driver ran: the mirrors "
        f"it reads and writes now carry their originals' names ({', '.join(tables)}), and "
        "the job writes them. The query stops; restart this driver with the same code and "
        "revision= (it continues from its checkpoint on the tables by their own names)"
    )
