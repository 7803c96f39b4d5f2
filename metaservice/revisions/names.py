"""The names a revision gives: its mirror tables and its revision jobs."""

from __future__ import annotations


def mirror_name(table: str, revision_id: int) -> str:
    """The mirror's identifier: ``ods.orders`` -> ``ods.orders__rev7``."""
    return f"{table}__rev{revision_id}"


def revision_job_name(job: str, revision_id: int) -> str:
    """The revision job that re-runs ``job`` into the mirrors: ``der`` -> ``der__rev7``."""
    return f"{job}__rev{revision_id}"
