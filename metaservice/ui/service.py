"""What the console asks of the store beyond the REST API: a table's live leases."""

from __future__ import annotations

from sqlalchemy.orm import Session

from metaservice.context import Context
from metaservice.schemas_common import Page
from metaservice.topology import repository as topology_repo
from metaservice.ui import repository as repo
from metaservice.ui.schemas import TableLease


def table_leases(
    session: Session, ctx: Context, table: str, limit: int, offset: int
) -> Page[TableLease]:
    found = topology_repo.require_table(session, table)
    now = ctx.now_ms()
    items = [
        TableLease(
            lease_id=lease_id,
            barrier=barrier,
            snapshot_id=snapshot,
            created_ms=created,
            expires_ms=expires,
            tables=tables,
        )
        for lease_id, barrier, snapshot, created, expires, tables in repo.live_leases(
            session, found.id, now, limit, offset
        )
    ]
    total = repo.count_live_leases(session, found.id, now)
    return Page(items=items, total=total, limit=limit, offset=offset)
