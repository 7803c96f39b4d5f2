"""Where the rules for handing out barriers and recording commits live.

The model's core is split by responsibility, one module each (this module only
re-exports what other packages import from it):

- :mod:`~metaservice.barriers.batches`: a batch asking for its barrier, the one entry
  for both kinds of job (a replayed batch gets the same answer);
- :mod:`~metaservice.barriers.batch_checks`: the job's row locked by name, and the
  refusals batch requests share (superseded, batch order, Spark query reset);
- :mod:`~metaservice.barriers.source_batches`: where a source barrier is decided, the
  replay of an abandoned batch, and abandoning a dead driver's batch;
- :mod:`~metaservice.barriers.derived_plans`: next-barrier and a derived batch's plan;
- :mod:`~metaservice.barriers.idle`: the idle advance of derived jobs;
- :mod:`~metaservice.barriers.ranges`: the snapshot ranges a derived batch reads, and
  a batch as answered;
- :mod:`~metaservice.barriers.reports`: commit reports, batch completion and the
  commit fence (:func:`~metaservice.barriers.reports.fence`);
- :mod:`~metaservice.barriers.offline`: offline grants and claims;
- :mod:`~metaservice.barriers.frontiers`: frontiers, sealing and alignment;
- :mod:`~metaservice.barriers.carried`: one request per batch, a barrier request
  carrying the job's reports, progress and promise, each part answered on its own;
- :mod:`~metaservice.barriers.changes` and
  :mod:`~metaservice.barriers.replica_changes`: long-poll wake-ups on a replica and
  across replicas (``LISTEN/NOTIFY``).

Every rule runs inside one write transaction and starts by locking the job's row,
which serialises all changes to one job's progress across threads and replicas.
"""

from __future__ import annotations

from metaservice.barriers.batches import batch_barrier
from metaservice.barriers.idle import advance_idle_many, could_advance
from metaservice.barriers.ranges import batch_view
from metaservice.barriers.reports import complete_batch, fence, report_commits, reports_table

__all__ = [
    "advance_idle_many",
    "batch_barrier",
    "batch_view",
    "complete_batch",
    "could_advance",
    "fence",
    "report_commits",
    "reports_table",
]
