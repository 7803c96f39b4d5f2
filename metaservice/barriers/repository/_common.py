"""What the barrier repository's modules share: a mapped class's plain table, and the
conditions and parameters their statements are built from."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Integer, bindparam
from sqlalchemy import Table as SqlTable

from metaservice.models import Batch, Job


def _table_of(model: type[Any]) -> SqlTable:
    """A mapped class's table, for plain statements (Core rather than the ORM)."""
    return cast(SqlTable, model.__table__)


# A batch that still holds its job's progress: given a barrier, neither committed nor
# abandoned by an operator.
_OPEN = Batch.committed.is_(False) & Batch.abandoned.is_(False)
# A batch Spark ran (the MetaService's own advances of idle jobs have negative ids).
_SPARK = Batch.batch_id >= 0
# The job id of the statements built once about one job's row and batches.
_JOB_ID = bindparam("job_id", type_=Integer)
# On the tables, not the mapped classes: the ORM's bulk paths cost more than the statements.
_JOBS = _table_of(Job)
