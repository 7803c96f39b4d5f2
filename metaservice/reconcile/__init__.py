"""Reconciliation: rebuild or check the barrier-to-snapshot mapping from the snapshot
summaries the barrier jobs stamp on their Iceberg tables (``metaservice reconcile``).

``service`` is pure database logic on plain data; ``iceberg`` reads the tables
through a pyiceberg catalog and feeds it.
"""
