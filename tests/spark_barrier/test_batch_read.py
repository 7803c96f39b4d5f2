"""BatchContext.read: only declared inputs and lookups, never in a source job, once the
table is exact at the batch's barrier, kept from expiry while the batch runs.

The service runs in-process (manual clock); no Spark is needed for these checks
(reading the snapshot itself is covered by the Spark lookup test in
test_consistency.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from pyiceberg.catalog import Catalog

from metaservice.app import create_app
from metaservice.client import MetaServiceClient, NotFoundError
from metaservice.clock import ManualClock
from metaservice.contract import encode_stamp
from metaservice.migrate import upgrade
from metaservice.settings import Settings
from spark_barrier import BarrierBatchError, BarrierConfigError, BarrierJob, BatchContext, stopping
from spark_barrier import job as job_module
from spark_barrier.iceberg.catalog import ensure_table, open_catalog

T0 = 1_700_000_000_000
SLOT = 1000


class InProcess(httpx.BaseTransport):
    """The TestClient's transport as an httpx one (it answers with httpx2 streams)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        body = response.read()
        return httpx.Response(response.status_code, headers=response.headers, content=body)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[MetaServiceClient, ManualClock]]:
    db_url = f"sqlite:///{tmp_path / 'ms.db'}"
    upgrade(db_url)
    clock = ManualClock(T0)
    with TestClient(create_app(Settings(db_url=db_url), clock)) as app:
        client = MetaServiceClient("http://testserver", transport=InProcess(app._transport))
        client.put_job("src_orders", outputs=["ods.orders"])
        client.put_job("src_items", outputs=["ods.items"])
        client.put_job("enrich", inputs=["ods.orders", "ods.items"], outputs=["dw.detail"])
        yield client, clock
        client.close()


def job(client: MetaServiceClient, tmp_path: Path, **kwargs: Any) -> BarrierJob:
    catalog = kwargs.pop("catalog", None)
    settings: dict[str, Any] = {
        "name": "enrich",
        "inputs": ["ods.orders"],
        "outputs": ["dw.detail"],
        "lookups": ["ods.items"],
        **kwargs,
    }
    return BarrierJob(
        spark=None,  # type: ignore[arg-type]
        client=client,
        catalog=catalog,
        catalog_options={},
        state_dir=tmp_path,
        reporter=None,  # type: ignore[arg-type]
        **settings,
    )


def test_a_table_the_job_does_not_declare_is_refused(service: Any, tmp_path: Path) -> None:
    client, _ = service
    ctx = BatchContext(job(client, tmp_path), batch_id=3, barrier=T0, start_barrier=0)
    with pytest.raises(BarrierConfigError, match=r"does not declare it; add it\s+to lookups="):
        ctx.read("ods.customers")


def test_a_source_job_cannot_read_at_its_barrier(service: Any, tmp_path: Path) -> None:
    client, _ = service
    source = job(client, tmp_path, name="src_orders", inputs=[], lookups=[])
    ctx = BatchContext(source, batch_id=0, barrier=T0, start_barrier=None)
    with pytest.raises(BarrierConfigError, match="is a source job"):
        ctx.read("ods.items")


def test_read_waits_until_the_lookup_is_exact_at_the_barrier_and_leases_it(
    service: Any, tmp_path: Path
) -> None:
    client, clock = service
    enrich = job(client, tmp_path, patience_s=20)
    barrier = client.batch_barrier("src_items", 0).barrier  # open: items not final there yet

    def commit_later() -> None:
        time.sleep(0.4)
        client.report_commit("src_items", 0, barrier, "ods.items", 42)
        clock.advance(2 * SLOT)

    writer = threading.Thread(target=commit_later)
    started = time.monotonic()
    writer.start()
    version = enrich._exact_version("ods.items", barrier)
    writer.join()
    assert time.monotonic() - started >= 0.4
    assert version.barrier == barrier and version.snapshots == {"ods.items": 42}
    assert version.lease_id is not None
    kept = client.expirable("ods.items").kept
    assert any(f"lease {version.lease_id} " in " ".join(k.reasons) for k in kept)

    ctx = BatchContext(enrich, batch_id=0, barrier=barrier, start_barrier=0)
    ctx.leases.append(version.lease_id)
    ctx.release()  # the sink does this when the batch ends
    assert ctx.leases == []
    with pytest.raises(NotFoundError):
        client.delete_lease(version.lease_id)


def _catalog_with_detail(tmp_path: Path) -> Catalog:
    """A real SQL catalog holding 'dw.detail', empty, as register() creates it."""
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", str(tmp_path / "wh"))
    ensure_table(catalog, "dw.detail", pa.schema([("order_id", pa.int64())]))
    return catalog


def _advance_enrich_idle(client: MetaServiceClient, clock: ManualClock) -> int:
    """The MetaService advances the idle 'enrich' (its inputs have no rows) from 0 straight
    to a later barrier, before it commits anything; returns that barrier."""
    client.put_job("report", inputs=["dw.detail"], outputs=["dws.report"])
    clock.advance(5 * SLOT)
    client.next_barrier("report")  # plans the downstream job: advances 'enrich'
    advanced_to = client.get_table("dw.detail").frontier
    assert advanced_to is not None and advanced_to > T0
    return advanced_to


def test_a_jobs_own_output_advanced_before_its_first_commit_reads_empty(
    service: Any, tmp_path: Path
) -> None:
    """No version of the output lies at or before a batch start below the barrier the
    job was advanced to; the output is final there and holds nothing: it reads empty at
    once. (The demo's revenue job once waited its whole patience on exactly this.)"""
    client, clock = service
    advanced_to = _advance_enrich_idle(client, clock)
    enrich = job(client, tmp_path, patience_s=2, catalog=_catalog_with_detail(tmp_path))
    ctx = BatchContext(enrich, batch_id=0, barrier=advanced_to + SLOT, start_barrier=T0)
    started = time.monotonic()
    assert enrich.version_in_batch(ctx, "dw.detail") is None
    assert time.monotonic() - started < 1.0
    # At the advanced barrier itself the service has a version: no snapshot.
    ctx = BatchContext(enrich, batch_id=0, barrier=advanced_to + SLOT, start_barrier=advanced_to)
    version = enrich.version_in_batch(ctx, "dw.detail")
    assert version is not None and version.snapshots == {"dw.detail": None}


def test_rows_another_writer_committed_there_are_not_read_as_empty(
    service: Any, tmp_path: Path
) -> None:
    """The same answers from the service, but the table holds a snapshot stamped at or
    below the barrier (committed by a writer the service no longer knows): the read
    does not pretend the table is empty; it waits, and says on what."""
    client, clock = service
    advanced_to = _advance_enrich_idle(client, clock)
    catalog = _catalog_with_detail(tmp_path)
    table = catalog.load_table("dw.detail")
    with table.transaction() as txn:
        txn.append(pa.table({"order_id": [1]}), encode_stamp(T0, "old_enrich", 0))
    enrich = job(client, tmp_path, patience_s=0.5, catalog=catalog)
    ctx = BatchContext(enrich, batch_id=0, barrier=advanced_to + SLOT, start_barrier=T0)
    with pytest.raises(BarrierBatchError, match="no_consistent_version"):
        enrich.version_in_batch(ctx, "dw.detail")


def test_an_output_not_yet_final_at_the_batch_start_is_waited_for(
    service: Any, tmp_path: Path
) -> None:
    """Without a version and not final at the start: the read waits (the empty answer
    above is only for a table whose frontier has passed the start)."""
    client, _ = service
    enrich = job(client, tmp_path, patience_s=0.5)
    ctx = BatchContext(enrich, batch_id=1, barrier=T0 + 2 * SLOT, start_barrier=T0 + SLOT)
    with pytest.raises(BarrierBatchError, match=r"'dw.detail' is not exact at barrier"):
        enrich.version_in_batch(ctx, "dw.detail")


def test_read_gives_up_when_the_lookup_never_gets_exact(service: Any, tmp_path: Path) -> None:
    client, _ = service
    enrich = job(client, tmp_path, patience_s=0.5)
    barrier = client.batch_barrier("src_items", 0).barrier  # never committed
    with pytest.raises(BarrierBatchError, match=r"'ods.items' is not exact at barrier") as error:
        enrich._exact_version("ods.items", barrier)
    assert error.value.code == "not_exact"


class _StoppableQuery:
    """What stop_between_batches uses of a StreamingQuery (no Spark in this module)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.isActive = True

    def stop(self) -> None:
        self.isActive = False


def test_stopping_the_query_ends_a_batch_waiting_for_a_table(
    service: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """query.stop() waits for the running foreachBatch call; a batch still waiting for a
    table that is not exact a grace period after the stop was asked gives up (code
    stopping) instead of after its patience."""
    monkeypatch.setattr(stopping, "STOP_GRACE_S", 0.5)
    client, _ = service
    enrich = job(client, tmp_path, patience_s=120)
    barrier = client.batch_barrier("src_items", 0).barrier  # never committed
    errors: list[BaseException] = []

    def batch() -> None:
        with job_module._in_batch("enrich"):
            try:
                enrich._exact_version("ods.items", barrier)
            except BaseException as exc:
                errors.append(exc)

    running = threading.Thread(target=batch)
    running.start()
    while not job_module._sink_busy("enrich"):
        time.sleep(0.01)
    started = time.monotonic()
    query = _StoppableQuery("enrich")
    job_module.stop_between_batches(query, timeout=60)  # type: ignore[arg-type]
    running.join(timeout=10)
    assert 0.5 <= time.monotonic() - started < 5
    assert not query.isActive
    assert len(errors) == 1 and isinstance(errors[0], BarrierBatchError)
    assert errors[0].code == "stopping"
    assert not job_module._stop_requested("enrich")  # a restarted query runs normally


def test_a_read_that_waits_long_says_on_what_once(
    service: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """A batch stuck on a table that never gets exact logs one warning naming the table,
    the barrier and the service's last answer, and fails with them after its patience."""
    client, _ = service
    monkeypatch.setattr(job_module, "WAIT_WARNING_S", 0.2)
    enrich = job(client, tmp_path, patience_s=1.5)
    barrier = client.batch_barrier("src_items", 0).barrier  # never committed
    with pytest.raises(
        BarrierBatchError, match=f"last answer: version at {barrier - 1000}, not final"
    ):
        enrich._exact_version("ods.items", barrier)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert f"'ods.items' to be exact at barrier {barrier}" in warnings[0]
    assert f"last answer: version at {barrier - 1000}, not final" in warnings[0]


def test_the_jobs_own_output_reads_as_of_the_batch_start(service: Any, tmp_path: Path) -> None:
    client, clock = service
    enrich = job(client, tmp_path, patience_s=20)
    for source, table in (("src_orders", "ods.orders"), ("src_items", "ods.items")):
        barrier = client.batch_barrier(source, 0).barrier
        client.report_commit(source, 0, barrier, table, 10)
    clock.advance(2 * SLOT)
    first = client.batch_barrier("enrich", 0)
    second = BatchContext(
        enrich, batch_id=1, barrier=first.barrier + SLOT, start_barrier=first.barrier
    )

    def report_later() -> None:  # the first batch's report is still in the outbox
        time.sleep(0.4)
        client.report_commit("enrich", 0, first.barrier, "dw.detail", 77)

    writer = threading.Thread(target=report_later)
    writer.start()
    version = enrich.version_in_batch(second, "dw.detail")
    writer.join()
    assert version is not None and version.barrier == first.barrier
    assert version.snapshots == {"dw.detail": 77} and version.lease_id is not None
    client.delete_lease(version.lease_id)
    before_any = BatchContext(enrich, batch_id=0, barrier=first.barrier, start_barrier=0)
    assert enrich.version_in_batch(before_any, "dw.detail") is None


def test_the_jobs_own_output_reads_at_a_start_its_history_skips_once_final_there(
    service: Any, tmp_path: Path
) -> None:
    """A batch may start at an end Spark planned while the MetaService advanced the idle
    job past it, so that barrier is not in the output's history; the output is final
    there, and its state is that of the job's last version before it."""
    client, clock = service
    enrich = job(client, tmp_path, patience_s=5)
    for source, table in (("src_orders", "ods.orders"), ("src_items", "ods.items")):
        barrier = client.batch_barrier(source, 0).barrier
        client.report_commit(source, 0, barrier, table, 10)
    clock.advance(2 * SLOT)
    first = client.batch_barrier("enrich", 0)
    client.report_commit("enrich", 0, first.barrier, "dw.detail", 77)
    clock.advance(5 * SLOT)
    for source, table in (("src_orders", "ods.orders"), ("src_items", "ods.items")):
        later = client.batch_barrier(source, 1).barrier
        client.report_commit(source, 1, later, table, None)
    clock.advance(2 * SLOT)
    client.consistent_version(["dw.detail"])  # advances the idle job past `skipped`
    skipped = first.barrier + SLOT
    history = [s.barrier for s in client.table_snapshots("dw.detail").items]
    assert skipped not in history
    assert client.get_table("dw.detail").frontier > skipped

    ctx = BatchContext(enrich, batch_id=1, barrier=skipped + SLOT, start_barrier=skipped)
    version = enrich.version_in_batch(ctx, "dw.detail")

    assert version is not None and version.barrier <= skipped
    assert version.snapshots == {"dw.detail": 77} and version.lease_id is not None


def test_a_first_batch_starting_where_the_idle_job_was_advanced_reads_its_output_empty(
    service: Any, tmp_path: Path
) -> None:
    """A derived job advanced while idle before its query first ran: the query starts at
    the job's frontier, so its first batch has a start, at which the job committed
    nothing. The output is final there and empty: the read gets that empty version at
    once, and does not wait for a commit that never comes."""
    client, clock = service
    enrich = job(client, tmp_path, patience_s=5)
    for source, table in (("src_orders", "ods.orders"), ("src_items", "ods.items")):
        barrier = client.batch_barrier(source, 0).barrier
        client.report_commit(source, 0, barrier, table, None)
    clock.advance(3 * SLOT)
    client.consistent_version(["dw.detail"])  # advances the idle job: nothing to read
    start = client.get_job("enrich").frontier
    assert start > 0 and client.get_job("enrich").last_batch_id is None

    ctx = BatchContext(enrich, batch_id=0, barrier=start + SLOT, start_barrier=start)
    started = time.monotonic()
    version = enrich.version_in_batch(ctx, "dw.detail")
    assert time.monotonic() - started < 2, "waited for a version of an output that is final"
    assert version is not None and version.barrier == start
    assert version.snapshots == {"dw.detail": None}
    assert version.lease_id is not None
    client.delete_lease(version.lease_id)
