"""Iceberg tables written by Spark executors and committed through pyiceberg.

No Spark Iceberg jars are involved: executors read Parquet with Spark and write
data files with pyiceberg's writer (partition transforms included, see `files`), the
driver only ever handles file paths and data-file descriptions, and pyiceberg owns
the Iceberg metadata (manifests, snapshots, catalog commits).

Every snapshot committed here is stamped with the summary properties
`metaservice.barrier`, `metaservice.job` and `metaservice.batch` (and, when the
Spark query is known, `metaservice.query`), which is what makes replays detectable
(exactly-once) and lets the MetaService rebuild its barrier-to-snapshot mapping
from the tables themselves.

A batch reaches a table at most once, whatever the retries: pyiceberg's own
commit retries are turned off on the tables committed to here (table property
`commit.retry.num-retries=0`; pyiceberg would otherwise re-apply a fast append on
top of another driver's commit of the same batch), and our retry loop checks for
the batch's snapshot before every attempt, on the metadata the attempt commits on.

Limitations, by design of this layer:
- Data files are matched to columns by name (Spark's Parquet reader); column
  renames are not supported, added columns read as null in older files.
- Partition specs are set when `ensure_table` creates a table (`partition_by`, see
  `partitioning`) and never evolved here; files are written under the table's
  current spec.
- Merge-on-read delete files are not supported (nothing here writes them); reading
  a snapshot that has them raises `NotImplementedError`.
"""
