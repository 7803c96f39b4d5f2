"""Expiry under random plans: appends and overwrites, retention, tags (some retained, so
they end), leases and expiries racing on threads. After every round nothing in use is
gone and everything reads as it was written; at the end every snapshot reported is
either in the table or recorded as expired, and no orphan file is left.

The tables, jobs and fixtures are test_expiry's (real Iceberg tables in a pyiceberg SQL
catalog in the service's database, real Parquet files, barriers from the service).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")

from fastapi.testclient import TestClient

from metaservice.clock import ManualClock
from metaservice.errors import Conflict
from metaservice.lifecycle.expiry import expire_table
from metaservice.lifecycle.schemas import ExpiryResult
from metaservice.versions import service as versions
from tests.metaservice import test_expiry
from tests.metaservice.helpers import API, SLOT, get_json, put_job
from tests.metaservice.test_expiry import (
    Lake,
    Written,
    expired_rows,
    on_disk,
    reachable,
    rows_at,
    services,
)

TABLE = "ods.orders"

# test_expiry's fixtures: a warehouse folder, the service's settings with it, the jobs'
# catalog on the service's database, and the Lake of tables and jobs.
warehouse = test_expiry.warehouse
settings = test_expiry.settings
catalog = test_expiry.catalog
lake = test_expiry.lake


class Plan:
    """What the random run asked for, and what it must find afterwards."""

    def __init__(self) -> None:
        self.written: list[Written] = []
        self.leases: list[Any] = []  # granted versions
        self.tags: dict[str, tuple[int, int | None]] = {}  # name -> (snapshot, ends at ms)
        self.keep_last = 0
        self.removed = 0

    def rows_of(self, snapshot_id: int) -> list[int]:
        return next(w.rows for w in self.written if w.snapshot_id == snapshot_id)


def write_round(lake: Lake, plan: Plan, rng: random.Random) -> None:
    for _ in range(rng.randint(2, 4)):
        i = len(plan.written)
        replace = i > 0 and rng.random() < 0.3
        plan.written.append(lake.batch("src", i, TABLE, [i], replace=replace))


def tag_some(client: TestClient, plan: Plan, rng: random.Random) -> None:
    if rng.random() < 0.5:
        return
    name = f"t{len(plan.tags)}"
    at = rng.choice(plan.written[-4:])
    body: dict[str, Any] = {"name": name, "tables": [TABLE], "at_or_before": at.barrier}
    if rng.random() < 0.5:
        body["retain_seconds"] = rng.randint(1, 6)
    r = client.post(f"{API}/versions/tags", json=body)
    if r.status_code == 409:
        assert r.json()["code"] == "expired", r.text  # an expiry passed that barrier
        return
    assert r.status_code == 201, r.text
    made = r.json()
    plan.tags[name] = (made["snapshots"][TABLE], made["expires_ms"])


def set_retention(client: TestClient, plan: Plan, rng: random.Random) -> None:
    keep_last = rng.choice([None, None, 1, 2, 3])
    if keep_last is None:  # back to the service's default
        r = client.delete(f"{API}/tables/{TABLE}/retention")
    else:
        r = client.put(f"{API}/tables/{TABLE}/retention", json={"keep_last": keep_last})
    assert r.status_code == 200, r.text
    plan.keep_last = r.json()["keep_last"]


def race(client: TestClient, plan: Plan, rng: random.Random) -> None:
    """Expiries and leases at random recent barriers, four threads at once."""
    svc = services(client)
    calls: list[Callable[[], Any]] = []
    for _ in range(8):
        if rng.random() < 0.35:
            calls.append(lambda: expire_table(svc.db, svc.ctx, TABLE))
        else:
            at, seconds = rng.choice(plan.written[-5:]).barrier, rng.randint(2, 6)
            calls.append(
                lambda at=at, n=seconds: svc.db.write(
                    lambda session: versions.lease_version(session, svc.ctx, [TABLE], at, n)
                )
            )
    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(call) for call in calls]:
            try:
                result = future.result(120)
            except Conflict as exc:
                assert exc.code == "expired", exc.message
                continue
            if isinstance(result, ExpiryResult):
                plan.removed += result.snapshots_removed
            else:
                plan.leases.append(result)


def check_in_use(client: TestClient, lake: Lake, plan: Plan, now: int) -> None:
    """Every snapshot in use is in the table and reads as written."""
    table = lake.catalog.load_table(TABLE)
    present = [s.snapshot_id for s in table.snapshots()]
    in_use: dict[int, str] = {plan.written[-1].snapshot_id: "current"}
    if plan.keep_last:
        for w in plan.written[-plan.keep_last :]:
            in_use.setdefault(w.snapshot_id, f"retention: newest {plan.keep_last}")
    for version in plan.leases:
        if version.lease_expires_ms > now:
            in_use.setdefault(version.snapshots[TABLE], f"lease {version.lease_id}")
    for name, (snapshot, ends) in plan.tags.items():
        if snapshot is not None and (ends is None or ends > now):
            in_use.setdefault(snapshot, f"tag {name}")
            tagged = table.snapshot_by_name(name)
            assert tagged is not None and tagged.snapshot_id == snapshot, (name, table.refs())
    for snapshot, why in in_use.items():
        assert snapshot in present, f"snapshot {snapshot} ({why}) was expired"
        assert rows_at(table, snapshot) == plan.rows_of(snapshot), why
    # Iceberg keeps a ref's head whatever the plan says: the plan must keep it itself.
    expirable = {
        s["snapshot_id"] for s in get_json(client, f"/tables/{TABLE}/expirable")["expirable"]
    }
    assert not expirable & set(in_use), {s: in_use[s] for s in expirable & set(in_use)}


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_random_plans_with_tags_retention_and_racing_leases_keep_everything_in_use(
    client: TestClient, lake: Lake, warehouse: Path, db_url: str, clock: ManualClock, seed: int
) -> None:
    rng = random.Random(seed)
    plan = Plan()
    put_job(client, "src", [TABLE])
    for _ in range(4):
        write_round(lake, plan, rng)
        tag_some(client, plan, rng)
        set_retention(client, plan, rng)
        race(client, plan, rng)
        check_in_use(client, lake, plan, clock.now_ms())
        clock.advance(rng.randint(0, 3) * SLOT)  # leases and retained tags end
    clock.advance(10 * SLOT)
    plan.removed += expire_table(services(client).db, services(client).ctx, TABLE).snapshots_removed
    check_in_use(client, lake, plan, clock.now_ms())

    assert plan.removed, "the plan never expired anything: the test checks nothing"
    table = lake.catalog.load_table(TABLE)
    present = {s.snapshot_id for s in table.snapshots()}
    recorded = {snapshot for _, snapshot, _ in expired_rows(db_url)}
    assert recorded | present == {w.snapshot_id for w in plan.written}
    assert not recorded & present and len(recorded) == plan.removed
    # ended tags' Iceberg refs are gone, live ones stay
    live_tags = {n for n, (_, ends) in plan.tags.items() if ends is None}
    assert set(table.refs()) - {"main"} == {n for n in live_tags if plan.tags[n][0] is not None}
    assert {p for p in on_disk(warehouse) if not p.endswith(".metadata.json")} == reachable(table)
