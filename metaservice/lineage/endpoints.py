from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Response

from metaservice.auth.schemas import Role
from metaservice.barriers.schemas import MAX_SIGNED_64
from metaservice.deps import Services, json_response, require, services
from metaservice.lineage import service
from metaservice.lineage.schemas import LineageGraph, SnapshotLineage
from metaservice.schemas_common import error_responses

router = APIRouter(tags=["lineage"], dependencies=[require(Role.READER)])


@router.get("/lineage", response_model=LineageGraph, responses=error_responses(404, 413))
async def lineage(
    table: str = Query(description="Table identifier"),
    direction: str = Query("both", pattern="^(upstream|downstream|both)$"),
    depth: int | None = Query(None, ge=0, description="How many jobs away; all when omitted"),
    s: Services = Depends(services),
) -> Response:
    """The jobs and tables up- and/or downstream of a table."""
    service.check_query(s.ctx, table, direction, depth)
    # Most answers come from the cached graph after one statement without a transaction;
    # a transaction builds the graph when the topology moved, or adds observed lineage.
    answer = await s.db.read_single_async(
        lambda conn: service.cached_lineage(conn, s.ctx, table, direction, depth)
    )
    if answer is None:
        answer = await s.db.read_async(
            lambda session: service.table_lineage(session, s.ctx, table, direction, depth)
        )
    return json_response(answer)


@router.get(
    "/lineage/snapshots/{table}/{snapshot_id}",
    response_model=SnapshotLineage,
    responses=error_responses(404),
)
def snapshot_lineage(
    table: str,
    snapshot_id: int = Path(ge=-MAX_SIGNED_64 - 1, le=MAX_SIGNED_64),
    s: Services = Depends(services),
) -> SnapshotLineage:
    """Which job, batch and barrier made a snapshot, and which input snapshots it consumed."""
    return s.db.read(lambda session: service.snapshot_lineage(session, table, snapshot_id))
