"""Topologies registered through the API, as the Spark jobs would."""

from __future__ import annotations

from typing import Any

from metaservice.clock import ManualClock
from tests.metaservice.helpers import API, put_job, run_batch

SLOT = 1000


def warehouse(http: Any, clock: ManualClock) -> None:
    """Two sources, a join, an aggregate and a report; a few batches each, and a lease.

    ods.orders, ods.items -> detail -> dwd.order_detail -> revenue -> dws.item_revenue
    -> report -> ads.daily_report; ads.daily_report also reads ods.items.
    """
    put_job(http, "orders_src", ["ods.orders"], description="Kafka orders topic")
    put_job(http, "items_src", ["ods.items"])
    put_job(http, "detail", ["dwd.order_detail"], inputs=["ods.orders", "ods.items"])
    put_job(http, "revenue", ["dws.item_revenue"], inputs=["dwd.order_detail"])
    put_job(http, "report", ["ads.daily_report"], inputs=["dws.item_revenue", "ods.items"])
    # items_src stops after two batches and report after one: the tables downstream of
    # ods.items fall behind, and their critical paths lead to it.
    for r in range(3):
        run_batch(http, "orders_src", r, {"ods.orders": 1000 + r})
        if r < 2:
            run_batch(http, "items_src", r, {"ods.items": 2000 + r})
        clock.advance(SLOT)
        if r < 2:
            run_batch(http, "detail", r, {"dwd.order_detail": 3000 + r})
            run_batch(http, "revenue", r, {"dws.item_revenue": 4000 + r})
        if r < 1:
            run_batch(http, "report", r, {"ads.daily_report": 5000 + r})
    clock.advance(30 * SLOT)
    r = http.post(
        f"{API}/leases", json={"tables": ["dwd.order_detail", "ods.orders"], "lease_seconds": 600}
    )
    assert r.status_code == 201, r.text


def wide(http: Any, clock: ManualClock, jobs: int = 100, outputs: int = 10) -> None:
    """``jobs`` jobs writing ``outputs`` tables each (1,000 tables by default): ten source
    jobs, and each other job reading two tables of earlier jobs. The sources commit once."""
    for j in range(jobs):
        names = [f"db{j % 7}.t{j:03d}_{k}" for k in range(outputs)]
        inputs = (
            []
            if j < 10
            else [
                f"db{(j // 2) % 7}.t{j // 2:03d}_{j % outputs}",
                f"db{(j - 3) % 7}.t{j - 3:03d}_0",
            ]
        )
        put_job(http, f"job{j:03d}", names, inputs=inputs)
    for j in range(10):
        run_batch(http, f"job{j:03d}", 0, {f"db{j % 7}.t{j:03d}_{k}": 1 for k in range(outputs)})
    clock.advance(5 * SLOT)
