"""Queries about derived jobs' batch plans (next-barrier's fixed answers) and the
barriers a derived job committed at, which plans are aligned to."""

from __future__ import annotations

from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from metaservice.models import Batch, BatchPlan


def get_plan(session: Session, job_id: int, after: int) -> BatchPlan | None:
    return session.get(BatchPlan, (job_id, after))


def plan_ending_at(
    session: Session, job_id: int, barrier: int, after_at_least: int
) -> BatchPlan | None:
    """The plan of the job that ends at ``barrier`` and starts no earlier than given."""
    return session.execute(
        select(BatchPlan)
        .where(
            BatchPlan.job_id == job_id,
            BatchPlan.barrier == barrier,
            BatchPlan.after >= after_at_least,
        )
        .order_by(BatchPlan.after.desc())
        .limit(1)
    ).scalar_one_or_none()


def drop_plans_upto(session: Session, job_id: int, after: int) -> None:
    """Forget plans of batches that start at or before ``after`` (their batch exists)."""
    drop_plans_upto_many(session, {job_id: after})


def drop_plans_upto_many(session: Session, upto: dict[int, int]) -> None:
    """:func:`drop_plans_upto` for several jobs (job id -> after) in one statement."""
    if upto:
        session.execute(
            delete(BatchPlan).where(
                or_(*((BatchPlan.job_id == j) & (BatchPlan.after <= a) for j, a in upto.items()))
            )
        )


def committed_barriers(session: Session, job_id: int, after: int, upto: int) -> list[int]:
    """Barriers a derived job committed in (after, upto], ascending."""
    return list(
        session.execute(
            select(Batch.barrier)
            .where(
                Batch.job_id == job_id,
                Batch.committed.is_(True),
                Batch.barrier > after,
                Batch.barrier <= upto,
            )
            .distinct()
            .order_by(Batch.barrier)
        ).scalars()
    )
