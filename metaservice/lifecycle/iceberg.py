"""The Iceberg side of an expiry: removing snapshots through pyiceberg, and finding and
deleting the files only they referenced.

This module imports pyiceberg (the ``iceberg`` extra); ``lifecycle.expiry`` imports it
only when an expiry has something to remove, so the service runs without pyiceberg.
Catalogs are loaded by :mod:`metaservice.catalog_loading`, as the Spark side loads them.

Which files go: every file a removed snapshot reached (its manifest list, its manifests,
and the data and delete files live in them), minus every file a snapshot still in the
table reaches, read from the metadata committed by the removal itself. Branch and tag
heads stay in the table, so whatever a ref uses is never deleted. A file is *live* in a
manifest when its entry is ADDED or EXISTING: a DELETED entry records that the snapshot
no longer has the file. A snapshot also reaches the log-store files its summary lists
(``metaservice.log-files``: rows its batch's log spilled), which only it owns.

The service deletes only what it owns: a file under the table's location, or under
``<location>/<table>`` of a configured log spill location (``log_spill_locations``, where
an external log service spills the table's rows). A snapshot's metadata is written by
whoever can commit to the table, so any other path it names is refused: logged, left in
place and listed in the expiry's answer (:class:`Doomed`). Paths are compared once
normalised (:func:`parse_location`): ``..`` cannot climb out, the scheme and bucket must
match, and ``file:///x`` and ``/x`` are the same place.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from typing import Literal
from urllib.parse import unquote, urlsplit

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables
from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFileContent, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.update import AssertTableUUID, RemoveSnapshotsUpdate
from sqlalchemy import inspect
from sqlalchemy.exc import OperationalError, ProgrammingError

from metaservice.catalog_loading import CATALOG_NAME, is_sql_catalog
from metaservice.catalog_loading import load_catalog as load_by_properties
from metaservice.contract import parse_log_files
from metaservice.lifecycle.catalog import first_line
from metaservice.settings import Settings

log = logging.getLogger(__name__)

# A removal loses the race against a concurrent commit at most this often in a row
# before the expiry gives up (the reservation stands; the next run retries).
COMMIT_ATTEMPTS = 5

FileKind = Literal["data", "deletes", "manifest", "manifest_list", "log"]


def load_catalog(settings: Settings) -> Catalog:
    """The jobs' catalog, as ``metaservice reconcile`` finds it: the ``catalog_properties``
    setting (``METASERVICE_CATALOG_PROPERTIES``) when set, else a SQL catalog in the
    MetaService's database with tables under ``warehouse``.

    The service only reads and updates tables the jobs made: it never creates a SQL
    catalog's own tables (``init_catalog_tables``), so an expiry on a database without
    them changes nothing.
    """
    from metaservice.reconcile.iceberg import catalog_properties

    properties = catalog_properties(settings)
    if is_sql_catalog(properties):
        properties.setdefault("init_catalog_tables", "false")
    return load_by_properties(properties, CATALOG_NAME)


def close_catalog(catalog: Catalog) -> None:
    """Release the catalog's database connections (a SQL catalog has an engine)."""
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()


def load_table(catalog: Catalog, identifier: str) -> Table | None:
    """The table, or None when the catalog has no such table (a SQL catalog that no job
    has written to yet has not even its own tables)."""
    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    except (OperationalError, ProgrammingError):
        engine = getattr(catalog, "engine", None)
        if engine is not None and not inspect(engine).has_table(IcebergTables.__tablename__):
            return None
        raise


@dataclass(frozen=True)
class TableFile:
    path: str
    kind: FileKind
    bytes: int


class Snapshots:
    """The snapshots of one loaded table, and the files each reaches (every manifest is
    read once, however many snapshots list it)."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.io: FileIO = table.io
        self._entries: dict[str, list[TableFile]] = {}
        # The first snapshot :meth:`files` found reaching each path.
        self.reached_by: dict[str, int] = {}

    @property
    def ids(self) -> set[int]:
        return {s.snapshot_id for s in self.table.metadata.snapshots}

    def ref_heads(self, dropping: Collection[tuple[str, int]] = ()) -> dict[int, list[str]]:
        """The snapshots that branches and tags point at, with the refs' names; a tag in
        ``dropping`` (name, snapshot id: one an expiry removes first) left out."""
        heads: dict[int, list[str]] = {}
        for name, ref in sorted(self.table.metadata.refs.items()):
            if ref.snapshot_ref_type == SnapshotRefType.TAG and (name, ref.snapshot_id) in dropping:
                continue
            heads.setdefault(ref.snapshot_id, []).append(name)
        return heads

    def files(self, snapshot_ids: Iterable[int]) -> dict[str, TableFile]:
        """Every file the snapshots reach, by path. Manifest lists and log files are not
        sized here (``bytes`` 0: sizing one is a request to the store; see :meth:`sized`)."""
        found: dict[str, TableFile] = {}
        for snapshot_id in snapshot_ids:
            snapshot = self.table.metadata.snapshot_by_id(snapshot_id)
            if snapshot is None:
                continue
            listing = snapshot.manifest_list
            found.setdefault(listing, TableFile(listing, "manifest_list", 0))
            for path in parse_log_files(snapshot.summary):
                found.setdefault(path, TableFile(path, "log", 0))
            for manifest in snapshot.manifests(self.io):
                path = manifest.manifest_path
                found.setdefault(path, TableFile(path, "manifest", manifest.manifest_length))
                for f in self._live_files(manifest):
                    found.setdefault(f.path, f)
            for path in found:
                self.reached_by.setdefault(path, snapshot_id)
        return found

    def _live_files(self, manifest: ManifestFile) -> list[TableFile]:
        path = manifest.manifest_path
        if path not in self._entries:
            self._entries[path] = [
                TableFile(
                    e.data_file.file_path,
                    "data" if e.data_file.content == DataFileContent.DATA else "deletes",
                    e.data_file.file_size_in_bytes,
                )
                for e in manifest.fetch_manifest_entry(self.io, discard_deleted=True)
            ]
        return self._entries[path]

    def sized(self, f: TableFile) -> TableFile:
        """``f`` with its size, for a manifest list or a log file (whose size no metadata
        records)."""
        if f.kind not in ("manifest_list", "log"):
            return f
        try:
            return replace(f, bytes=len(self.io.new_input(f.path)))
        except FileNotFoundError:
            return f


# Set on a revision's mirror (``revisions.iceberg``), and kept when it is swapped in: its
# first snapshot reads the original's files, which the original (renamed) still owns.
MIRROR_OF_PROPERTY = "metaservice.mirror-of"

# Schemes that name the same store (pyiceberg reads all of them as S3).
_SAME_SCHEME = {"s3a": "s3", "s3n": "s3"}


@dataclass(frozen=True)
class Location:
    """A place in a store, normalised: scheme, bucket (or host), absolute path."""

    scheme: str
    bucket: str
    path: str

    def contains(self, other: Location) -> bool:
        """Whether ``other`` lies strictly below this place."""
        if (self.scheme, self.bucket) != (other.scheme, other.bucket):
            return False
        return other.path.startswith(self.path.rstrip("/") + "/")


def parse_location(uri: str) -> Location | None:
    """``uri`` normalised (``file://`` and plain paths alike, ``s3a://`` as ``s3://``);
    None when it cannot be placed safely: a NUL, a ``..`` segment (a file system resolves
    it through symlinks, an object store keeps it as part of the key), an empty or ``.``
    segment in an object store's key (another key than the one without it), or a
    ``file`` URI naming a host (which pyiceberg would read as a relative path)."""
    if "\x00" in uri:
        return None
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    segments = parts.path.strip("/").split("/")
    if ".." in segments:
        return None
    if scheme in ("", "file"):
        if parts.netloc:
            return None
        # A plain path is relative to the working folder, as pyiceberg's FileIO takes it.
        path = os.path.abspath(parts.path if scheme else uri)
        return Location("file", "", posixpath.normpath(path))
    if parts.path.strip("/") and any(s in ("", ".") for s in segments):
        return None
    if parts.path.startswith("//"):
        return None
    return Location(_SAME_SCHEME.get(scheme, scheme), parts.netloc, "/" + "/".join(segments))


def owned_by(roots: Iterable[str]) -> Callable[[str], bool]:
    """Whether a path lies under one of ``roots`` (URIs or folders). A path whose
    percent-decoded form is elsewhere is not (a store might decode it)."""
    places = [p for p in (parse_location(r) for r in roots) if p is not None]

    def inside(path: str) -> bool:
        forms = {path, unquote(path)}
        found = [parse_location(f) for f in forms]
        return all(f is not None and any(p.contains(f) for p in places) for f in found)

    return inside


def owned_roots(table: Table, identifier: str, spill_locations: Iterable[str]) -> list[str]:
    """Where an expiry of ``table`` may delete: its location, and the table's folder of
    each log spill location (an external log service spills ``<location>/<table>``)."""
    return [table.location()] + [f"{s.rstrip('/')}/{identifier}" for s in spill_locations]


@dataclass(frozen=True)
class Doomed:
    """The files only the removed snapshots reached: those the expiry deletes, and those
    it refuses to (outside what the service owns)."""

    files: list[TableFile]
    refused: list[tuple[TableFile, int]]  # with the snapshot that names it


def unused_files(
    before: Snapshots,
    removed: Collection[int],
    after: Snapshots,
    owned: Callable[[str], bool],
) -> Doomed:
    """The files the ``removed`` snapshots reached in ``before`` that no snapshot of
    ``after`` reaches, in a stable order (data first, then manifests, then lists), split
    by ``owned`` (see :func:`owned_by`). A (former) mirror's files outside its location
    are its original's: they are neither deleted nor refused."""
    live = after.files(after.ids - set(removed))
    shared = MIRROR_OF_PROPERTY in after.table.metadata.properties
    mine = owned_by([after.table.location()])
    files, refused = [], []
    for path, f in before.files(removed).items():
        if path in live:
            continue
        if shared and f.kind != "log" and not mine(path):
            continue
        if owned(path):
            files.append(before.sized(f))
        else:
            refused.append((f, before.reached_by[path]))
    order = {"data": 0, "deletes": 1, "log": 2, "manifest": 3, "manifest_list": 4}
    return Doomed(
        sorted(files, key=lambda f: (order[f.kind], f.path)),
        sorted(refused, key=lambda r: (order[r[0].kind], r[0].path)),
    )


def remove_snapshots(
    catalog: Catalog, identifier: str, snapshot_ids: Collection[int]
) -> tuple[Table, list[int]]:
    """Commit the removal of ``snapshot_ids`` from the table; returns the table as the
    removal left it and the ids this commit removed. Snapshots that are gone already (an
    overlapping run took them), or are a branch or tag head by now, are left out, read
    from the metadata each attempt commits on."""
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        table = catalog.load_table(identifier)
        present = Snapshots(table)
        heads = present.ref_heads()
        ids = sorted(i for i in snapshot_ids if i in present.ids and i not in heads)
        if not ids:
            return table, []
        try:
            # One RemoveSnapshotsUpdate, as pyiceberg's expire_snapshots() commits, but
            # without its by_ids(), which copies the whole metadata twice per snapshot
            # (quadratic: 120 s for 1,000 snapshots in bench/bench_expiry.py).
            removal = RemoveSnapshotsUpdate(snapshot_ids=ids)
            catalog.commit_table(
                table, (AssertTableUUID(uuid=table.metadata.table_uuid),), (removal,)
            )
        except (CommitFailedException, ValueError) as exc:
            # CommitFailedException: another commit landed first. ValueError: the
            # removal applied on newer metadata, where an overlapping expiry may have
            # removed some of these snapshots already.
            if attempt == COMMIT_ATTEMPTS:
                raise
            log.info("expiry of %s lost a race (%s); retrying", identifier, first_line(exc, 200))
            continue
        return catalog.load_table(identifier), ids
    raise AssertionError("unreachable")


def delete_files(io: FileIO, files: Iterable[TableFile]) -> list[TableFile]:
    """Delete ``files``; returns those deleted (one gone already is not: an overlapping
    run took it)."""
    deleted = []
    for f in files:
        try:
            io.delete(f.path)
        except FileNotFoundError:
            continue
        deleted.append(f)
    return deleted
