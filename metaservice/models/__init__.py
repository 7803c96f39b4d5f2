"""ORM models. Importing this package registers every table on ``Base.metadata``."""

from metaservice.models.auth import ApiToken
from metaservice.models.barriers import Batch, BatchInput, BatchPlan, ClockState, Commit
from metaservice.models.base import Base
from metaservice.models.catalog_sessions import CatalogSession
from metaservice.models.leases import Lease, LeaseSnapshot
from metaservice.models.lifecycle import ExpiredSnapshot, TableRetention
from metaservice.models.openlineage import (
    ObservedDataset,
    ObservedEdge,
    ObservedJob,
    OpenLineageEvent,
    OpenLineageOutbox,
)
from metaservice.models.revisions import Revision, RevisionSwapStep, RevisionTable
from metaservice.models.tags import VersionTag, VersionTagSnapshot
from metaservice.models.topology import DERIVED, SOURCE, Job, JobInput, Table, TableExactBarrier

__all__ = [
    "DERIVED",
    "SOURCE",
    "ApiToken",
    "Base",
    "Batch",
    "BatchInput",
    "BatchPlan",
    "CatalogSession",
    "ClockState",
    "Commit",
    "ExpiredSnapshot",
    "Job",
    "JobInput",
    "Lease",
    "LeaseSnapshot",
    "ObservedDataset",
    "ObservedEdge",
    "ObservedJob",
    "OpenLineageEvent",
    "OpenLineageOutbox",
    "Revision",
    "RevisionSwapStep",
    "RevisionTable",
    "Table",
    "TableExactBarrier",
    "TableRetention",
    "VersionTag",
    "VersionTagSnapshot",
]
