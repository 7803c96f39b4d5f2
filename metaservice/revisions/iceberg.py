"""The Iceberg side of revisions: making a mirror table from an original's metadata, and
dropping it, through pyiceberg.

A mirror is metadata only. Its metadata JSON is the original's with a new table uuid, its
own location (so whatever is written to the mirror lands there), its ``main`` branch on
the start snapshot, and that snapshot as its only one: the manifest list, manifests and
data files it reads are the original's, and nothing is copied. The start snapshot's older
ancestors are left out on purpose: the original's expiry may remove them and their
files (only the start snapshot is kept while the revision is active), and a mirror
listing them would then name files that are gone. The start snapshot keeps its parent
id, as a snapshot whose parent was expired does. A table empty at the barrier gets a
mirror with the same schema, partition spec and sort order and no snapshot.

The mirror is registered with ``register_table``, and dropped with ``drop_table``, which
removes the catalog's entry and deletes no file: the files are the original's.

This module imports pyiceberg (the ``iceberg`` extra); ``revisions.mirrors`` imports it
only when a revision is created or cancelled.
"""

from __future__ import annotations

import logging
import uuid

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io import FileIO
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import SnapshotLogEntry

from metaservice.lifecycle.iceberg import MIRROR_OF_PROPERTY, load_table

log = logging.getLogger(__name__)

# Table properties that mark a mirror as the MetaService's: only such a table is dropped
# (MIRROR_OF_PROPERTY, with the original's name, also keeps its expiry off the original's
# files).
REVISION_PROPERTY = "metaservice.revision"
# Properties that would send the mirror's own writes to the original's folders.
_WRITE_PATHS = (
    "write.data.path",
    "write.metadata.path",
    "write.object-storage.path",
    "write.folder-storage.path",
)


class OriginalMissing(Exception):
    """The original table, or its start snapshot, is not in the catalog."""


class MirrorTaken(Exception):
    """The catalog has a table of the mirror's name already."""


def mirror_location(original: Table, revision_id: int) -> str:
    """Beside the original's folder: ``.../ods.db/orders`` -> ``.../ods.db/orders__rev7``."""
    return f"{original.location().rstrip('/')}__rev{revision_id}"


def mirror_metadata(
    original: Table,
    snapshot_id: int | None,
    location: str,
    revision_id: int,
    now_ms: int,
) -> TableMetadata:
    """The original's metadata as a mirror's that starts at ``snapshot_id`` (None: empty).
    Raises ``OriginalMissing`` when the original lacks the snapshot."""
    metadata = original.metadata
    snapshots = []
    if snapshot_id is not None:
        snapshot = metadata.snapshot_by_id(snapshot_id)
        if snapshot is None:
            raise OriginalMissing(
                f"snapshot {snapshot_id} is not in the Iceberg table '{_name(original)}'"
            )
        snapshots = [snapshot]
    properties = {k: v for k, v in metadata.properties.items() if k not in _WRITE_PATHS}
    properties[REVISION_PROPERTY] = str(revision_id)
    properties[MIRROR_OF_PROPERTY] = _name(original)
    return metadata.model_copy(
        update={
            "table_uuid": uuid.uuid4(),
            "location": location,
            # never before the original's (Iceberg's Java readers refuse a table last
            # updated before its snapshot log's entries)
            "last_updated_ms": max(now_ms, metadata.last_updated_ms),
            "properties": properties,
            "current_snapshot_id": snapshot_id,
            "snapshots": snapshots,
            "snapshot_log": [
                SnapshotLogEntry(snapshot_id=s.snapshot_id, timestamp_ms=s.timestamp_ms)
                for s in snapshots
            ],
            "metadata_log": [],
            "refs": {}
            if snapshot_id is None
            else {
                MAIN_BRANCH: SnapshotRef(
                    snapshot_id=snapshot_id,
                    snapshot_ref_type=SnapshotRefType.BRANCH,
                    min_snapshots_to_keep=None,
                    max_snapshot_age_ms=None,
                    max_ref_age_ms=None,
                )
            },
            # statistics files are computed for the original's snapshots, and its own
            "statistics": [],
            "partition_statistics": [],
        }
    )


def create_mirror(
    catalog: Catalog,
    original_name: str,
    mirror: str,
    snapshot_id: int | None,
    revision_id: int,
    now_ms: int,
) -> str:
    """Write the mirror's metadata JSON and register it as ``mirror``; returns the
    metadata file's location. Raises ``OriginalMissing``, ``MirrorTaken``; on any failure
    the metadata file written here is deleted again."""
    original = load_table(catalog, original_name)
    if original is None:
        raise OriginalMissing(f"the Iceberg table '{original_name}' is not in the catalog")
    location = mirror_location(original, revision_id)
    metadata = mirror_metadata(original, snapshot_id, location, revision_id, now_ms)
    path = f"{location}/metadata/00000-{uuid.uuid4()}.metadata.json"
    ToOutputFile.table_metadata(metadata, original.io.new_output(path))
    try:
        catalog.register_table(mirror, path)
    except BaseException as exc:
        _delete(original.io, path)
        if isinstance(exc, TableAlreadyExistsError):
            raise MirrorTaken(f"the catalog has a table '{mirror}' already") from exc
        raise
    return path


def drop_mirror(
    catalog: Catalog, mirror: str, revision_id: int, *, made_at: str | None = None
) -> bool:
    """Drop the mirror from the catalog (no data file is deleted); True when this call
    dropped it. A table of that name that is not this revision's mirror is left alone.
    ``made_at``: undoing a mirror just made, whose metadata file (still its only one) is
    deleted too."""
    found = load_table(catalog, mirror)
    if found is None:
        return False
    if found.metadata.properties.get(REVISION_PROPERTY) != str(revision_id):
        log.warning("%s is not the mirror of revision %d: left alone", mirror, revision_id)
        return False
    try:
        catalog.drop_table(mirror)
    except NoSuchTableError:
        return False
    if made_at is not None and found.metadata_location == made_at:
        _delete(found.io, made_at)
    return True


def _delete(io: FileIO, path: str) -> None:
    try:
        io.delete(path)
    except Exception:
        log.warning("could not delete %s (an orphan now)", path, exc_info=True)


def _name(table: Table) -> str:
    return ".".join(table.name())
