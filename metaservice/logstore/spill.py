"""Where a table's log puts rows it cannot hold in memory: Arrow IPC files in a folder of
the warehouse (or any place a pyiceberg FileIO reaches), one file per spilled entry.

A log spills only rows no snapshot holds yet (an unpersisted batch past the memory bound);
rows already in a snapshot are simply dropped, readers find them in the table. The writer
asks for a batch's spilled files right before committing it and records them in the
snapshot's summary (:data:`metaservice.contract.SUMMARY_LOG_FILES`); from then on the
snapshot owns them: expiring the snapshot deletes them (``lifecycle.iceberg``), and the log
forgets them without deleting when it lets the batch go. Files of a batch that was never
claimed (a batch dropped by a writer's reset, or committed without asking) are deleted by
the log itself when it drops the entry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from metaservice.logstore import ipc

if TYPE_CHECKING:
    from pyiceberg.io import FileIO

__all__ = ["Spill", "SpillFile"]

log = logging.getLogger(__name__)


@dataclass
class SpillFile:
    """One spilled entry's file. ``claimed``: a snapshot summary may list it (the writer
    asked for it before its commit), so only that snapshot's expiry deletes it."""

    path: str
    claimed: bool = False


class Spill:
    """A folder for one table's spilled entries, written and read through a FileIO."""

    def __init__(self, folder: str, properties: dict[str, str] | None = None) -> None:
        from pyiceberg.io import load_file_io

        self.folder = folder.rstrip("/")
        self.properties = dict(properties or {})
        self._io: FileIO = load_file_io(self.properties, self.folder)

    def __repr__(self) -> str:
        return f"Spill({self.folder!r})"

    def write(self, epoch: int, batch_id: int, seq: int, rows: pa.RecordBatch) -> SpillFile:
        path = f"{self.folder}/{epoch}-{batch_id}-{seq}.arrow"
        with self._io.new_output(path).create(overwrite=True) as out:
            out.write(ipc.encode([rows], rows.schema))
        return SpillFile(path)

    def read(self, spilled: SpillFile) -> pa.RecordBatch:
        """The entry's rows (FileNotFoundError when the file is gone)."""
        with self._io.new_input(spilled.path).open() as stream:
            batches = ipc.decode(stream.read())
        if len(batches) != 1:
            raise ValueError(f"{spilled.path} holds {len(batches)} record batches, not 1")
        return batches[0]

    def delete(self, spilled: SpillFile) -> None:
        try:
            self._io.delete(spilled.path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # an orphan file, never a failed append or reset
            log.warning("could not delete the spilled log file %s: %s", spilled.path, exc)
