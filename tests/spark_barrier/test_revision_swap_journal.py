"""A revision swapped through a catalog outside the MetaService's database, with real
Spark jobs: a SQL catalog in a PostgreSQL database of its own (test_catalogs'
``pg_catalog_url``), the MetaService on SQLite, and the catalog's first rename failing
once. The swap answers 503 with the renames left; until they are done, expiry and cancel
are refused; the retry finishes the same renames, and a reader of the consistent version
then reads the revised table by its name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from pyiceberg.catalog.sql import SqlCatalog

import spark_barrier
from examples.embedded import EmbeddedMetaService
from metaservice.client import MetaServiceClient
from metaservice.settings import Settings
from spark_barrier.iceberg.catalog import load_catalog
from tests.spark_barrier import test_catalogs
from tests.spark_barrier.pipeline import NUMBERS_SCHEMA, DrivenSource, Service
from tests.spark_barrier.test_revision import VALUES_SCHEMA, times, values_at, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.postgres]

SOURCE, VALUES = "ods.numbers", "dw.values"
FAIL_ONCE = "metaservice-test.fail-first-rename"  # a catalog property: the marker file

pg_catalog_url = test_catalogs.pg_catalog_url


class RenameFailsOnce(SqlCatalog):
    """pyiceberg's SQL catalog whose first rename fails (once per marker file): the
    catalog as the MetaService opens it (``py-catalog-impl``)."""

    def rename_table(self, from_identifier: Any, to_identifier: Any) -> Any:
        marker = Path(self.properties[FAIL_ONCE])
        if not marker.exists():
            marker.write_text(f"{from_identifier} -> {to_identifier}")
            raise OSError("the catalog's database went away (injected once)")
        return super().rename_table(from_identifier, to_identifier)


def test_a_swap_whose_rename_fails_once_is_finished_by_the_retry(
    spark: Any, pg_catalog_url: str, tmp_path: Path
) -> None:
    warehouse = str(tmp_path / "tables")
    jobs_catalog = {"type": "sql", "uri": pg_catalog_url, "warehouse": warehouse}
    marker = tmp_path / "rename-failed"
    service_catalog = {
        "py-catalog-impl": f"{__name__}.{RenameFailsOnce.__name__}",
        "uri": pg_catalog_url,
        "warehouse": warehouse,
        FAIL_ONCE: str(marker),
    }
    db_url = f"sqlite:///{tmp_path / 'metaservice.db'}"
    settings = Settings(
        db_url=db_url,
        warehouse=warehouse,
        barrier_interval_ms=500,
        port=0,
        catalog_properties=service_catalog,
    )
    catalog = load_catalog(jobs_catalog)
    with EmbeddedMetaService(settings) as url, MetaServiceClient(url) as client:
        service = Service(url, db_url, warehouse, tmp_path / "state", client, catalog)
        _run(spark, service, marker)
    catalog.engine.dispose()  # type: ignore[attr-defined]


def _register(spark: Any, service: Service, **kwargs: Any) -> spark_barrier.BarrierJob:
    return spark_barrier.register(
        spark, service.url, catalog=service.catalog, state_dir=service.state_dir, **kwargs
    )


def _run(spark: Any, service: Service, marker: Path) -> None:
    ingest = _register(spark, service, job="ingest", outputs={SOURCE: NUMBERS_SCHEMA})
    feed = DrivenSource(spark, service, "ingest", SOURCE)
    double = _register(
        spark, service, job="double", inputs=[SOURCE], outputs={VALUES: VALUES_SCHEMA}
    )
    original = double.start(
        double.source(SOURCE), double.sink(transform=times(2, [])), trigger_seconds=0.3
    )
    queries, jobs = [original], [ingest, double]

    def caught_up(job: str) -> Any:
        last = feed.rows[-1][1]
        return lambda: service.client.get_job(job).frontier >= last

    try:
        for _ in range(2):
            feed.batch(rows=3)
        wait_until(caught_up("double"), "double", queries)
        from_barrier = service.client.consistent_version([VALUES]).barrier
        revision = service.client.create_revision(VALUES, from_barrier)
        rid = revision.id
        revised = _register(
            spark,
            service,
            job="double",
            inputs=[SOURCE],
            outputs={VALUES: VALUES_SCHEMA},
            revision=rid,
        )
        jobs.append(revised)
        query = revised.start(
            revised.source(SOURCE), revised.sink(transform=times(3, [])), trigger_seconds=0.3
        )
        queries.append(query)
        feed.batch(rows=3)
        wait_until(caught_up(revised.name), "the revision job", queries)

        api = f"{service.url}/api/v1"
        failed = httpx.post(f"{api}/revisions/{rid}/swap", json={"wait_seconds": 120}, timeout=180)

        assert failed.status_code == 503, failed.text
        assert failed.json()["code"] == "catalog_unavailable"
        assert marker.read_text() == f"{VALUES} -> {VALUES}__pre_rev{rid}"
        assert service.client.get_revision(rid).state == "swapped"
        # the catalog is not renamed yet: its dw.values is still the original
        assert "metaservice.revision" not in service.catalog.load_table(VALUES).properties
        for name in (VALUES, f"{VALUES}__pre_rev{rid}", f"{VALUES}__rev{rid}"):
            refused = httpx.post(f"{api}/tables/{name}/expire", timeout=60)
            assert refused.status_code == 409, refused.text
            assert refused.json()["code"] == "swap_unfinished"
        cancel = httpx.delete(f"{api}/revisions/{rid}", timeout=60)
        assert cancel.status_code == 409 and cancel.json()["code"] == "revision_swapped"
        assert f"POST /api/v1/revisions/{rid}/swap again" in failed.json()["message"]

        done = service.client.swap_revision(rid, wait_seconds=60)

        assert done.state == "swapped"
        swapped_in = service.catalog.load_table(VALUES)
        assert swapped_in.properties.get("metaservice.revision") == str(rid)
        old = service.catalog.load_table(f"{VALUES}__pre_rev{rid}")
        assert "metaservice.revision" not in old.properties
        assert not service.catalog.table_exists(f"{VALUES}__rev{rid}")
        again = service.client.swap_revision(rid, wait_seconds=60)
        assert (again.id, again.state) == (rid, "swapped")
        assert service.catalog.load_table(VALUES).metadata_location == swapped_in.metadata_location
        version = service.client.consistent_version([SOURCE, VALUES])
        expected = {i: (2 if b <= from_barrier else 3) * i for i, b in feed.rows}
        assert values_at(service, VALUES, version.snapshots[VALUES]) == expected
        expired = httpx.post(f"{api}/tables/{VALUES}/expire", timeout=60)
        assert expired.status_code == 200, expired.text
        assert values_at(service, VALUES, version.snapshots[VALUES]) == expected
    finally:
        for q in queries:
            if q.isActive:
                spark_barrier.stop_between_batches(q)
        for job in jobs:
            job.close()
