"""The Iceberg side of tags: making and removing a tag in one table through pyiceberg.

This module imports pyiceberg (the ``iceberg`` extra); ``tags.publish`` imports it only
when a tag is made or removed, so the service runs without pyiceberg.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType

from metaservice.lifecycle.iceberg import load_table

log = logging.getLogger(__name__)

# A tag's commit loses the race against a concurrent commit (a writer's, an expiry's) at
# most this often in a row before the request gives up (and undoes what it made).
COMMIT_ATTEMPTS = 5


@dataclass(frozen=True)
class Ref:
    """A branch or tag of a table."""

    kind: str  # "branch" or "tag"
    snapshot_id: int


class RefTaken(Exception):
    """The table has a branch or tag of that name already, not the one asked for."""

    def __init__(self, table: str, name: str, ref: Ref) -> None:
        super().__init__(f"{table} has a {ref.kind} '{name}' on snapshot {ref.snapshot_id}")
        self.table, self.name, self.ref = table, name, ref


class SnapshotMissing(Exception):
    """The snapshot to tag is not in the Iceberg table."""


def ref_named(table: Table, name: str) -> Ref | None:
    found = table.metadata.refs.get(name)
    if found is None:
        return None
    return Ref(str(found.snapshot_ref_type.value), found.snapshot_id)


def max_ref_age_ms(
    table: Table, snapshot_id: int, expires_ms: int | None, now_ms: int
) -> int | None:
    """The tag's max-ref-age, so that Iceberg ends it when the MetaService does: Iceberg
    counts a ref's age from its snapshot's commit time, so the snapshot's age at tagging
    is added to the time the tag is retained (never less than that time)."""
    if expires_ms is None:
        return None
    snapshot = table.snapshot_by_id(snapshot_id)
    committed = snapshot.timestamp_ms if snapshot is not None else now_ms
    return max(expires_ms - now_ms, expires_ms - committed, 1)


def create_tag(
    catalog: Catalog,
    identifier: str,
    name: str,
    snapshot_id: int,
    expires_ms: int | None,
    now_ms: int,
) -> bool:
    """Tag ``snapshot_id`` of the table as ``name``; True when this call made the tag,
    False when that very tag was there already. Raises ``RefTaken`` when another branch
    or tag holds the name, ``SnapshotMissing`` when the table lacks the snapshot (or
    the table itself is missing)."""
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        table = load_table(catalog, identifier)
        if table is None or table.snapshot_by_id(snapshot_id) is None:
            raise SnapshotMissing(
                f"snapshot {snapshot_id} is not in the Iceberg table '{identifier}'"
                + (" (no such table in the catalog)" if table is None else "")
            )
        ref = ref_named(table, name)
        if ref == Ref(SnapshotRefType.TAG.value, snapshot_id):
            return False
        if ref is not None:
            raise RefTaken(identifier, name, ref)
        age = max_ref_age_ms(table, snapshot_id, expires_ms, now_ms)
        try:
            table.manage_snapshots().create_tag(snapshot_id, name, max_ref_age_ms=age).commit()
        except CommitFailedException as exc:
            # another commit landed first, or the same name was taken meanwhile: look again
            if attempt == COMMIT_ATTEMPTS:
                raise
            log.info("tagging %s as %s lost a race (%s); retrying", identifier, name, exc)
            continue
        return True
    raise AssertionError("unreachable")


def remove_tag(catalog: Catalog, identifier: str, name: str, snapshot_id: int) -> bool:
    """Remove the tag ``name`` of the table if it is the MetaService's (a tag on
    ``snapshot_id``); True when this call removed it. A ref of that name on another
    snapshot, or a branch, is someone else's and stays."""
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        table = load_table(catalog, identifier)
        if table is None:
            return False
        ref = ref_named(table, name)
        if ref is None:
            return False
        if ref != Ref(SnapshotRefType.TAG.value, snapshot_id):
            log.warning(
                "%s has a %s '%s' on snapshot %d, not the tag on %d: left alone",
                identifier,
                ref.kind,
                name,
                ref.snapshot_id,
                snapshot_id,
            )
            return False
        try:
            table.manage_snapshots().remove_tag(name).commit()
        except CommitFailedException as exc:
            if attempt == COMMIT_ATTEMPTS:
                raise
            log.info("removing tag %s of %s lost a race (%s); retrying", name, identifier, exc)
            continue
        return True
    raise AssertionError("unreachable")
