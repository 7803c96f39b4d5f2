"""A table's Iceberg metadata pinned to one snapshot, for engines that read through the
REST catalog (imports pyiceberg: the ``iceberg`` extra).

Engines pick the snapshot they read in different ways, so the pinned metadata leaves
them no other choice:

- ``current-snapshot-id`` and the ``main`` branch name the pinned snapshot, and no other
  ref is kept (tags and branches may point past it);
- only the pinned snapshot and its ancestors are kept, with their snapshot-log entries:
  nothing committed later is listed;
- their timestamps, the log's and ``last-updated-ms`` are at most ``min(pinned commit
  time, barrier)``: an engine that picks "the latest snapshot at or before now" by its
  own clock would otherwise read an older snapshot whenever the writer's clock ran ahead
  of the reader's (a barrier is a time of the MetaService's clock, and the pinned
  snapshot was committed after it);
- the schema is the pinned snapshot's, the metadata log is empty;
- a table empty at the version has no snapshot and reads as empty.

The same metadata is written as a file in the table's own metadata folder, for engines
that read only the file at ``metadata-location``. Some of them (ClickHouse) accept only
Iceberg's own names (``vN.metadata.json``, ``vN-<uuid>``, ``N-<uuid>``), so it is named
``00000-00000000-<digest>.metadata.json``: version 0 with a uuid of leading zeros,
which sorts before every metadata file a catalog writes (``00000-<uuid>`` first), so
nothing that lists the folder for the highest version takes it for the table's latest.
The digest of its content makes the same pin the same file. A file deleted (by hand, or
by a tool cleaning the folder) is written again at the next load.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Snapshot, SnapshotLogEntry

from metaservice.iceberg_rest.catalogs import catalog_of
from metaservice.settings import Settings

PINNED_PREFIX = "00000-00000000-"  # version 0, a uuid sorting first: see above


class SnapshotGone(LookupError):
    """The pinned snapshot is no longer in the table's metadata."""


def pinned(
    metadata: TableMetadata, snapshot_id: int | None, barrier: int, *, refs_only: bool = False
) -> TableMetadata:
    """``metadata`` as of ``snapshot_id`` (None: the table was empty at the version).

    ``refs_only`` keeps just the pinned snapshot (the REST ``snapshots=refs`` mode)."""
    if snapshot_id is None:
        cutoff = min(metadata.last_updated_ms, barrier)
        return metadata.model_copy(
            update={
                "current_snapshot_id": None,
                "snapshots": [],
                "snapshot_log": [],
                "refs": {},
                "metadata_log": [],
                "statistics": [],
                "partition_statistics": [],
                "last_updated_ms": cutoff,
            }
        )
    by_id = {s.snapshot_id: s for s in metadata.snapshots}
    head = by_id.get(snapshot_id)
    if head is None:
        raise SnapshotGone(snapshot_id)
    cutoff = min(head.timestamp_ms, barrier)
    kept = [head] if refs_only else _ancestry(head, by_id)
    kept_ids = {s.snapshot_id for s in kept}
    return metadata.model_copy(
        update={
            "current_snapshot_id": snapshot_id,
            "current_schema_id": head.schema_id
            if head.schema_id is not None
            else metadata.current_schema_id,
            "snapshots": [_at_most(s, cutoff) for s in kept],
            "snapshot_log": _log(metadata, kept_ids, snapshot_id, cutoff),
            "refs": {
                MAIN_BRANCH: SnapshotRef(
                    snapshot_id=snapshot_id,
                    snapshot_ref_type=SnapshotRefType.BRANCH,
                    min_snapshots_to_keep=None,
                    max_snapshot_age_ms=None,
                    max_ref_age_ms=None,
                )
            },
            "metadata_log": [],
            "statistics": [s for s in metadata.statistics if s.snapshot_id in kept_ids],
            "partition_statistics": [
                s for s in metadata.partition_statistics if s.snapshot_id in kept_ids
            ],
            "last_updated_ms": cutoff,
        }
    )


def _ancestry(head: Snapshot, by_id: dict[int, Snapshot]) -> list[Snapshot]:
    """``head`` and the ancestors still in the table, oldest first."""
    chain = [head]
    seen = {head.snapshot_id}
    parent = head.parent_snapshot_id
    while parent is not None and parent in by_id and parent not in seen:
        chain.append(by_id[parent])
        seen.add(parent)
        parent = by_id[parent].parent_snapshot_id
    return chain[::-1]


def _at_most(snapshot: Snapshot, cutoff: int) -> Snapshot:
    if snapshot.timestamp_ms <= cutoff:
        return snapshot
    return snapshot.model_copy(update={"timestamp_ms": cutoff})


def _log(
    metadata: TableMetadata, kept_ids: set[int], head: int, cutoff: int
) -> list[SnapshotLogEntry]:
    entries = [
        SnapshotLogEntry(snapshot_id=e.snapshot_id, timestamp_ms=min(e.timestamp_ms, cutoff))
        for e in metadata.snapshot_log
        if e.snapshot_id in kept_ids
    ]
    if not entries or entries[-1].snapshot_id != head:
        entries.append(SnapshotLogEntry(snapshot_id=head, timestamp_ms=cutoff))
    return entries


def as_json(metadata: TableMetadata) -> dict[str, Any]:
    """The metadata as the REST answer and the file carry it. An empty table says
    ``current-snapshot-id: -1`` (the spec's older form, which every reader takes for
    "no snapshot") rather than leaving the field out."""
    body: dict[str, Any] = json.loads(metadata.model_dump_json())
    body.setdefault("current-snapshot-id", -1)
    return body


def write_pinned(io: FileIO, location: str, body: dict[str, Any]) -> str:
    """Where the pinned metadata file is, writing it first if it is not there."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    d = hashlib.sha256(text).hexdigest()
    name = f"{PINNED_PREFIX}{d[:4]}-{d[4:8]}-{d[8:12]}-{d[12:24]}.metadata.json"
    path = f"{location.rstrip('/')}/metadata/{name}"
    if not io.new_input(path).exists():
        with io.new_output(path).create(overwrite=True) as out:
            out.write(text)
    return path


# -- the tables' catalog --------------------------------------------------------------------

# Pinned answers made lately, by (table, snapshot, barrier, refs only): a query loads the
# same tables again and again, and a pin depends on nothing that changes but the
# ancestors an expiry removes, which a short life keeps from being served for long.
PINNED_CACHE_SECONDS = 30.0
PINNED_CACHE_ENTRIES = 4096


@dataclass(frozen=True)
class _Pinned:
    made: float
    io: FileIO
    location: str
    body: dict[str, Any]


_pins: OrderedDict[tuple[str, int | None, int, bool], _Pinned] = OrderedDict()
_pins_lock = threading.Lock()


def load_pinned(
    settings: Settings, name: str, snapshot_id: int | None, barrier: int, *, refs_only: bool
) -> tuple[str, dict[str, Any]]:
    """(metadata location, metadata) of table ``name`` pinned to ``snapshot_id``; the file
    at the location is there when this returns.

    Raises pyiceberg's ``NoSuchTableError`` when the catalog has no such table, and
    :class:`SnapshotGone` when its metadata no longer holds the snapshot."""
    key = (name, snapshot_id, barrier, refs_only)
    now = time.monotonic()
    with _pins_lock:
        hit = _pins.get(key)
    if hit is not None and now - hit.made < PINNED_CACHE_SECONDS:
        if not hit.io.new_input(hit.location).exists():
            write_pinned(hit.io, hit.location.rsplit("/metadata/", 1)[0], hit.body)
        return hit.location, hit.body
    table = catalog_of(settings).load_table(name)
    body = as_json(pinned(table.metadata, snapshot_id, barrier, refs_only=refs_only))
    location = write_pinned(table.io, table.metadata.location, body)
    with _pins_lock:
        _pins[key] = _Pinned(now, table.io, location, body)
        _pins.move_to_end(key)
        while len(_pins) > PINNED_CACHE_ENTRIES:
            _pins.popitem(last=False)
    return location, body
