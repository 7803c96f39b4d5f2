"""The queries of table lineage (its graph comes from topology.graph's cache)."""

from __future__ import annotations

from sqlalchemy import Connection, exists, or_, select
from sqlalchemy.orm import Session

from metaservice.models import ClockState, ObservedDataset, ObservedJob

# The topology version and whether anything was observed, in one statement: a lineage
# answer from the cached graph needs nothing else, so it can be read without a
# transaction (Database.read_single).
_TOPOLOGY_STATE = select(
    ClockState.topology_version,
    or_(exists().select_from(ObservedJob), exists().select_from(ObservedDataset)),
).where(ClockState.id == 1)


def topology_state(session: Session | Connection) -> tuple[int, bool]:
    """The database's topology version, and whether it holds observed (OpenLineage)
    jobs or datasets."""
    version, observed = session.execute(_TOPOLOGY_STATE).one()
    return int(version), bool(observed)
