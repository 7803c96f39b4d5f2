"""One Iceberg transaction adding (and removing) data files in one stamped snapshot."""

from __future__ import annotations

import logging
from typing import Any

from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation

log = logging.getLogger(__name__)

# pyiceberg guarantees a commit failing with these did not land (it cleans up its
# manifests), so the commit may be retried and files written for it deleted. A
# ValidationException is a conflicting concurrent change: an upsert re-plans.
NOT_LANDED = (CommitFailedException, ValidationException)


def commit_files(
    table: Table, stamp: dict[str, str], added: list[DataFile], deleted: list[DataFile]
) -> int:
    """One transaction: fast append, an overwrite when files are replaced, or a delete
    when files are only removed."""
    txn = MetadataOnceTransaction(table)
    _ensure_name_mapping(txn)
    update = txn.update_snapshot(snapshot_properties=stamp)
    # An overwrite validates against concurrent commits (serializable: any data
    # file added meanwhile, or any of `deleted` gone, is a ValidationException);
    # a fast append needs no validation.
    producer: Any = update.overwrite() if deleted else update.fast_append()
    if deleted and not added:
        # pyiceberg's own delete producer plans by predicate, not by file: the
        # overwrite's producer removes the files, recorded as what it is.
        producer._operation = Operation.DELETE
    with producer:
        for data_file in deleted:
            producer.delete_data_file(data_file)
        for data_file in added:
            producer.append_data_file(data_file)
    txn.commit_transaction()
    return int(producer.snapshot_id)


def _ensure_name_mapping(txn: Transaction) -> None:
    # Spark's files carry no Iceberg field ids; readers (pyiceberg, other engines)
    # resolve their columns through the table's default name mapping.
    if txn.table_metadata.name_mapping() is None:
        mapping = txn.table_metadata.schema().name_mapping.model_dump_json()
        txn.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})


class MetadataOnceTransaction(Transaction):
    """pyiceberg's transaction, computing its staged metadata once per staged update.

    pyiceberg (0.12) builds ``Transaction.table_metadata`` anew on every access: it
    applies every staged update to the table's metadata and deep-copies the result,
    every snapshot of the table's history included. One fast append reads it 19
    times, so a commit's cost grew with the history: at 220 snapshots, 91 ms of which
    about 60 were copies (a probe on 2 cores; 30 ms with this class). The metadata is
    a function of the table's metadata object and the tuple of staged updates, both of
    which pyiceberg replaces rather than changes (its models are frozen, and staging
    makes a new tuple), so it is kept until either is another object.
    """

    _metadata_of: tuple[TableMetadata, tuple[Any, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        kept = self._metadata_of
        if kept is None or kept[0] is not base or kept[1] is not updates:
            kept = self._metadata_of = (base, updates, super().table_metadata)
        return kept[2]
