"""Every query about jobs' batches and the barrier-to-snapshot mapping, one module per
responsibility (the names are re-exported here, so ``repository.lock_job`` reads as
before):

- :mod:`.batches`: jobs' rows locked, the barrier clock, batches, their inputs and commits;
- :mod:`.plans`: derived jobs' batch plans and the barriers they are aligned to;
- :mod:`.idle`: the idle advance's closure, locks, first changes and writes;
- :mod:`.frontiers`: source progress and sealing;
- :mod:`.exactness`: where a table is exact, across its writers;
- :mod:`.reports`: a commit report request's set-based read and writes;
- :mod:`.snapshots`: the barrier-to-snapshot mapping.
"""

from __future__ import annotations

from metaservice.barriers.repository.batches import (
    NewBatchFacts,
    add_batch_inputs,
    batch_and_newest,
    batch_input_tables,
    batches_by_id,
    clock,
    commit_with_snapshot,
    count_batch_commits,
    count_outputs_of_batch,
    delete_batch_commits,
    get_batch,
    has_batches,
    insert_batch,
    insert_batches,
    insert_open_batch,
    jobs_with_open_batches,
    lock_job,
    lock_jobs_by_name,
    new_batch_facts,
    newest_batch,
    next_batch_id,
    open_batch,
    open_batches,
    previous_batch,
    raise_clock,
    raise_last_issued,
    touch_job,
    touch_job_id,
)
from metaservice.barriers.repository.exactness import (
    keep_exact_barriers,
    latest_exact_at_or_before,
)
from metaservice.barriers.repository.frontiers import (
    SourceProgress,
    latest_committed_at_or_before,
    seal,
    seal_candidates,
    source_progress,
)
from metaservice.barriers.repository.idle import (
    advanced_batch,
    committed_in_ranges,
    derived_upstream,
    first_changes,
    try_lock_jobs,
    write_advances,
)
from metaservice.barriers.repository.plans import (
    committed_barriers,
    drop_plans_upto,
    drop_plans_upto_many,
    get_plan,
    plan_ending_at,
)
from metaservice.barriers.repository.reports import (
    BatchRow,
    CommitRow,
    report_rows,
    write_reports,
)
from metaservice.barriers.repository.snapshots import (
    LatestSnapshot,
    latest_snapshots,
    snapshot_at,
    snapshots_at,
    snapshots_at_barriers,
)

__all__ = [
    "BatchRow",
    "CommitRow",
    "LatestSnapshot",
    "NewBatchFacts",
    "SourceProgress",
    "add_batch_inputs",
    "advanced_batch",
    "batch_and_newest",
    "batch_input_tables",
    "batches_by_id",
    "clock",
    "commit_with_snapshot",
    "committed_barriers",
    "committed_in_ranges",
    "count_batch_commits",
    "count_outputs_of_batch",
    "delete_batch_commits",
    "derived_upstream",
    "drop_plans_upto",
    "drop_plans_upto_many",
    "first_changes",
    "get_batch",
    "get_plan",
    "has_batches",
    "insert_batch",
    "insert_batches",
    "insert_open_batch",
    "jobs_with_open_batches",
    "keep_exact_barriers",
    "latest_committed_at_or_before",
    "latest_exact_at_or_before",
    "latest_snapshots",
    "lock_job",
    "lock_jobs_by_name",
    "new_batch_facts",
    "newest_batch",
    "next_batch_id",
    "open_batch",
    "open_batches",
    "plan_ending_at",
    "previous_batch",
    "raise_clock",
    "raise_last_issued",
    "report_rows",
    "seal",
    "seal_candidates",
    "snapshot_at",
    "snapshots_at",
    "snapshots_at_barriers",
    "source_progress",
    "touch_job",
    "touch_job_id",
    "try_lock_jobs",
    "write_advances",
    "write_reports",
]
