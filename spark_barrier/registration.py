"""Registration: :func:`register`, which registers a job with the MetaService and makes
a Spark session ready to run it, and its checks (the MetaService answers, the catalog
loads and its warehouse is writable, inputs and lookups exist, outputs can be made),
which fail fast with :class:`BarrierConfigError` before anything is registered or created.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from metaservice.client import ApiError, ConflictError, MetaServiceClient, Unavailable
from spark_barrier.carry import BatchRequests, carry_seconds
from spark_barrier.errors import BarrierConfigError
from spark_barrier.iceberg import manifests
from spark_barrier.iceberg.catalog import (
    CATALOG_NAME,
    CatalogUnavailable,
    check_partition_by,
    check_warehouse,
    ensure_table,
    load_catalog,
    normalised_properties,
    sql_catalog_properties,
)
from spark_barrier.iceberg.partitioning import PartitionSpecError
from spark_barrier.job import SOURCE_TRIGGER_S, BarrierJob
from spark_barrier.listener import listener_for
from spark_barrier.log import check_log_options, open_job_log
from spark_barrier.offline import OfflineBarriers
from spark_barrier.report import DirectReporter, OutboxReporter, Reporter
from spark_barrier.revision import RevisionJob, RevisionModeError, revision_job
from spark_barrier.source import BarrierSource

# The logger register() has always logged to (it lived in spark_barrier.job).
_log_name = "spark_barrier.job"


def register(
    spark: SparkSession,
    url: str,
    *,
    job: str,
    inputs: Sequence[str] = (),
    outputs: Mapping[str, StructType | None] | Sequence[str],
    lookups: Sequence[str] = (),
    description: str = "",
    catalog_properties: Mapping[str, str] | None = None,
    catalog_uri: str | None = None,
    warehouse: str | None = None,
    catalog: Catalog | None = None,
    state_dir: str | Path | None = None,
    token: str | None = None,
    outbox: bool = True,
    outbox_options: Mapping[str, Any] | None = None,
    offline: bool = True,
    patience_s: float = 3600.0,
    read_lease_s: int = 3600,
    partition_by: Mapping[str, Sequence[str]] | None = None,
    revision: int | None = None,
    log: str | None = None,
    log_url: str | Sequence[str] | None = None,
) -> BarrierJob:
    """Register ``job`` with the MetaService and make ``spark`` ready to run it.

    ``inputs`` are streamed (``job.source(table)``); ``lookups`` are tables a derived
    job only reads as of each batch's barrier (``ctx.read(table)`` in the transform).
    Both are the job's inputs for the MetaService, so its barriers wait for both.

    Checks, failing fast with :class:`BarrierConfigError`: the MetaService answers,
    the catalog loads and its warehouse can be written (a small object is written and
    deleted there), every input and lookup table exists in the catalog, and no other
    job writes the outputs. A failed check registers nothing and creates no table.
    Output tables given with a schema are created when missing, partitioned as
    ``partition_by`` says (output name -> spec such as ``["day(ordered_at)",
    "bucket(16, item_id)"]``; see :mod:`spark_barrier.iceberg.partitioning`); every
    output's schema and spec are checked before the job is registered and before any
    table is created. Registers the barrier data source and a listener reporting the
    query's progress.

    The tables' catalog is any pyiceberg catalog, by its ``catalog_properties`` (as
    ``pyiceberg.catalog.load_catalog`` takes them: ``type``, ``uri``, ``warehouse``,
    ``s3.endpoint``...; see :mod:`spark_barrier.iceberg.catalog`). Without them it is
    a SQL catalog at ``catalog_uri`` with tables under ``warehouse`` (a folder or an
    ``s3://`` URI), each defaulting to the MetaService's own settings
    (``METASERVICE_DB_URL``, ``METASERVICE_WAREHOUSE``): the catalog shares its
    database. An open ``catalog`` is used by the driver as is; the barrier sources
    (driver and executors) load the same catalog from its properties.
    Reports go through a durable outbox under ``state_dir`` unless ``outbox=False``
    (``outbox_options``: :class:`spark_barrier.outbox.Outbox` settings such as
    ``max_bytes`` or ``fsync``).
    A source job (no ``inputs``) with an outbox holds an offline grant unless
    ``offline=False``: while the MetaService is unreachable its batches get barriers
    of their own and go on committing (see ``spark_barrier.offline``). Other batches
    wait up to ``patience_s`` for an unreachable MetaService before failing.
    What ``ctx.read`` reads is leased for ``read_lease_s`` (released when its batch ends).
    ``revision``: run the job in that revision (see :mod:`spark_barrier.revision`) as
    the revision's job, on its mirror tables; the code keeps naming the original tables.
    ``log``: give the outputs a log store (see :mod:`spark_barrier.log`): "embedded" (a
    log service in this driver) or "external" (the one at ``log_url``, started by
    ``metaservice log start``; a list of addresses spreads each partitioned output's
    rows over those services by partition, see :mod:`metaservice.logstore.routing`).
    """
    log_mode = log  # (``log`` is the module's logger elsewhere)
    properties = _catalog_properties(job, catalog_properties, catalog_uri, warehouse, catalog)
    client = MetaServiceClient(url, token=token)
    _check_reachable(client)
    aliases: dict[str, str] = {}
    if revision is not None:
        running = _in_revision(client, job, revision)
        job, aliases = running.job, dict(running.tables)
        inputs, lookups = [running.table(t) for t in inputs], [running.table(t) for t in lookups]
        if isinstance(outputs, Mapping):
            outputs = {running.table(t): schema for t, schema in outputs.items()}
        else:
            outputs = [running.table(t) for t in outputs]
        partition_by = {running.table(t): spec for t, spec in (partition_by or {}).items()}
    if log_mode is not None or log_url is not None:
        check_log_options(log_mode, log_url, job=job)
    catalog = _check_catalog(job, catalog, properties)
    catalog_options = {"catalog": json.dumps(properties), "catalog_name": catalog.name}
    output_names = list(outputs)
    _check_lookups(job, inputs, lookups)
    _check_inputs(catalog, job, [*inputs, *lookups])
    missing = _check_outputs(catalog, job, outputs, partition_by or {})
    try:
        client.put_job(
            job, inputs=[*inputs, *lookups], outputs=output_names, description=description
        )
    except ConflictError as exc:
        raise BarrierConfigError(f"MetaService refused job '{job}': {exc.message}") from exc
    except ApiError as exc:
        raise BarrierConfigError(f"MetaService refused job '{job}': {exc.message}") from exc
    for name, (schema, spec) in missing.items():
        ensure_table(catalog, name, schema, partition_by=spec)
    job_log = open_job_log(spark, log_mode, log_url, client)
    if job_log is not None:
        try:
            job_log.open(
                client,
                job,
                {name: catalog.load_table(name) for name in output_names},
                client.get_job(job).last_batch_id,
                properties,
            )
        except Exception:
            job_log.close()
            raise
    spark.dataSource.register(BarrierSource)
    listener = listener_for(spark, client)
    listener.jobs.add(job)
    manifests.install()  # the driver plans and commits every batch: read each manifest once
    state = Path(state_dir or "spark-barrier-state") / job
    state.mkdir(parents=True, exist_ok=True)
    reporter: Reporter
    offline_barriers = None
    carrying: OutboxReporter | None = None
    if outbox:
        outbox_reporter = OutboxReporter(client, state / "outbox", **(outbox_options or {}))
        if offline and not inputs:
            offline_barriers = OfflineBarriers(client, job, outbox_reporter.outbox, state)
            offline_barriers.report_in()  # reachable: _check_reachable passed
        reporter = outbox_reporter
        if not inputs:
            carrying = outbox_reporter  # a derived job's reports go at once (carry.py)
    else:
        reporter = DirectReporter(client, give_up_after_s=patience_s)
    # One request per batch: the batch's barrier request carries the last batch's
    # report (source jobs), its progress and the offline-grant promise.
    interval_ms = offline_barriers.interval_ms if offline_barriers is not None else None
    carry_s = carry_seconds(interval_ms or int(SOURCE_TRIGGER_S * 1000))
    if carrying is not None:
        carrying.carry_s = carry_s
    listener.carry(job, carry_s)
    requests = BatchRequests(client, job, carrying, listener, offline_barriers)
    if offline_barriers is not None:
        offline_barriers.ask = lambda batch_id, query_id: requests.ask(batch_id, query_id=query_id)
    logging.getLogger(_log_name).info(
        "job '%s' registered: inputs %s, outputs %s", job, list(inputs), output_names
    )
    return BarrierJob(
        spark,
        client,
        catalog,
        catalog_options,
        job,
        inputs,
        output_names,
        state,
        reporter,
        offline=offline_barriers,
        patience_s=patience_s,
        lookups=lookups,
        read_lease_s=read_lease_s,
        aliases=aliases,
        revision=revision,
        log=job_log,
        requests=requests,
        interval_ms=interval_ms,
    )


def _in_revision(client: MetaServiceClient, job: str, revision: int) -> RevisionJob:
    try:
        return revision_job(client, job, revision)
    except RevisionModeError as exc:
        raise BarrierConfigError(str(exc)) from exc


def _check_lookups(job: str, inputs: Sequence[str], lookups: Sequence[str]) -> None:
    if lookups and not inputs:
        raise BarrierConfigError(
            f"job '{job}' declares lookups {list(lookups)} but no inputs: lookups are read "
            "as of the barriers of a derived job's batches, which its streamed inputs drive"
        )
    both = sorted(set(inputs) & set(lookups))
    if both:
        raise BarrierConfigError(
            f"job '{job}' declares {both} both as inputs and as lookups; an input is "
            "streamed and can be read with ctx.read too, so declare it once"
        )


def _catalog_properties(
    job: str,
    properties: Mapping[str, str] | None,
    catalog_uri: str | None,
    warehouse: str | None,
    catalog: Catalog | None,
) -> dict[str, str]:
    """The pyiceberg properties of the job's catalog, as its sources load it."""
    if properties is not None and (catalog_uri or warehouse):
        raise BarrierConfigError(
            f"job '{job}' is given both catalog_properties and catalog_uri/warehouse (a "
            "shorthand for the default SQL catalog); pass the catalog one way: put "
            "'uri' and 'warehouse' in catalog_properties"
        )
    if properties is None:
        if catalog is not None and not (catalog_uri or warehouse):
            properties = catalog.properties  # the sources load the catalog given
        else:
            properties = sql_catalog_properties(catalog_uri, warehouse)
    return normalised_properties(properties)


def _check_catalog(job: str, catalog: Catalog | None, properties: Mapping[str, str]) -> Catalog:
    """The job's catalog, loaded (unless given), with its warehouse writable."""
    try:
        catalog = catalog or load_catalog(properties, CATALOG_NAME)
        check_warehouse(catalog)
    except CatalogUnavailable as exc:
        raise BarrierConfigError(f"job '{job}' cannot use its Iceberg catalog: {exc}") from exc
    return catalog


def _check_reachable(client: MetaServiceClient) -> None:
    try:
        client.list_jobs(limit=1)
    except Unavailable as exc:
        raise BarrierConfigError(
            f"the MetaService at {client.url} is unreachable ({exc.__cause__ or exc}); "
            "start it with `metaservice start` or pass the right url"
        ) from exc


def _check_inputs(catalog: Catalog, job: str, inputs: Sequence[str]) -> None:
    for name in inputs:
        if not catalog.table_exists(name):
            raise BarrierConfigError(
                f"input table '{name}' of job '{job}' does not exist in the catalog; "
                "register the job that writes it first (with its schema), or fix the name"
            )


def _check_outputs(
    catalog: Catalog,
    job: str,
    outputs: Mapping[str, StructType | None] | Sequence[str],
    partition_by: Mapping[str, Sequence[str]],
) -> dict[str, tuple[StructType, Sequence[str]]]:
    """The outputs to create (name -> schema and partition spec), every one checked;
    creates nothing, so a registration refused on one output leaves no table behind."""
    schemas: Mapping[str, Any] = outputs if isinstance(outputs, Mapping) else dict.fromkeys(outputs)
    unknown = sorted(set(partition_by) - set(schemas))
    if unknown:
        raise BarrierConfigError(
            f"job '{job}' gives partition_by for {unknown}, which are not among its outputs "
            f"{sorted(schemas)}"
        )
    missing: dict[str, tuple[StructType, Sequence[str]]] = {}
    for name, schema in schemas.items():
        spec = list(partition_by.get(name, ()))
        if catalog.table_exists(name):
            existing = catalog.load_table(name)
            if spec and existing.spec().is_unpartitioned():
                raise BarrierConfigError(
                    f"output table '{name}' exists unpartitioned, but job '{job}' asks for "
                    f"partition_by {spec}; drop partition_by, or create the table anew"
                )
            continue
        if schema is None:
            raise BarrierConfigError(
                f"output table '{name}' does not exist; pass its schema: outputs={{'{name}': StructType(...)}}"
            )
        try:
            check_partition_by(schema, spec)
        except PartitionSpecError as exc:
            raise BarrierConfigError(f"output table '{name}' of job '{job}': {exc}") from exc
        missing[name] = (schema, spec)
    return missing
