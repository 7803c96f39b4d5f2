"""Manifest entries read once per driver, not once per scan and commit.

pyiceberg reads and decodes every manifest of a snapshot each time it plans a scan or
commits an overwrite (to find the entries a commit deletes), in Python: the Avro
header and schema of each file, then its entries. A streaming table gets a manifest
per batch (fast appends and CDC overwrites keep the earlier ones), so a driver that
commits and plans every second decodes the same, growing, set of files over and over:
on the demo's pipeline (4 queries, local[2]) that decoding took about a third of the
driver's Python samples (py-spy), holding the interpreter's lock while the sinks
waited for it.

A manifest file is immutable (Iceberg writes each under a new name and never
rewrites it), so its entries are the same every time it is read. :func:`install`
makes pyiceberg's ``ManifestFile.fetch_manifest_entry`` keep what it read, keyed by
the file and by the manifest-list fields its entries inherit (sequence numbers,
snapshot id, spec id), up to ``MAX_ENTRIES`` entries (least recently used first out).
Callers get a new list of the same entry objects, which pyiceberg does not change
after reading them (it builds new entries to write).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntry, ManifestFile

# At most this many entries are kept (a few KB each with their column statistics).
MAX_ENTRIES = 100_000

_Key = tuple[Any, ...]
_lock = threading.Lock()
_kept: OrderedDict[_Key, list[ManifestEntry]] = OrderedDict()
_size = 0
_original: Any = None


def install() -> None:
    """Keep manifest entries once read (idempotent; for this process)."""
    global _original
    with _lock:
        if _original is not None:
            return
        _original = ManifestFile.fetch_manifest_entry
        ManifestFile.fetch_manifest_entry = _fetch_manifest_entry  # type: ignore[method-assign,assignment]


def uninstall() -> None:
    """pyiceberg's own reading again, and nothing kept (tests)."""
    global _original, _size
    with _lock:
        if _original is not None:
            ManifestFile.fetch_manifest_entry = _original  # type: ignore[method-assign]
            _original = None
        _kept.clear()
        _size = 0


def kept_entries() -> int:
    with _lock:
        return _size


def _fetch_manifest_entry(
    manifest: ManifestFile, io: FileIO, discard_deleted: bool = True
) -> list[ManifestEntry]:
    global _size
    key = (
        manifest.manifest_path,
        manifest.added_snapshot_id,
        manifest.sequence_number,
        manifest.min_sequence_number,
        manifest.partition_spec_id,
        discard_deleted,
    )
    with _lock:
        entries = _kept.get(key)
        if entries is not None:
            _kept.move_to_end(key)
            return list(entries)
        original = _original
    assert original is not None
    entries = original(manifest, io, discard_deleted)
    with _lock:
        if key not in _kept and len(entries) <= MAX_ENTRIES:
            _kept[key] = entries
            _size += len(entries)
            while _size > MAX_ENTRIES:
                _, dropped = _kept.popitem(last=False)
                _size -= len(dropped)
    return list(entries)
