"""A revision of the demo pipeline's detail table with real Spark: `dwd.order_detail`
re-derived from a barrier with corrected pricing and `dws.item_revenue` downstream with
unchanged code, while a reader samples consistent versions every 200 ms
(examples/revise_order_detail.py)."""

from __future__ import annotations

from decimal import Decimal as D
from typing import Any

import pytest

from examples import revise_order_detail as rev
from examples import warehouse_pipeline as wp
from tests.spark_barrier.pipeline import Service


def _tables(
    lines: list[tuple[int, int, str | None, str | None]],
) -> dict[str, list[dict[str, Any]]]:
    """Orders, detail and revenue rows from (order_id, item_id, price, amount) lines."""
    detail = [
        {"order_id": o, "item_id": i, "quantity": 3, "price": _d(p), "amount": _d(a)}
        for o, i, p, a in lines
    ]
    revenue: dict[int, dict[str, Any]] = {}
    for line in detail:
        item = revenue.setdefault(
            line["item_id"], {"item_id": line["item_id"], "revenue": D(0), "order_count": 0}
        )
        item["revenue"] += line["amount"] or D(0)
        item["order_count"] += 1
    return {
        wp.ORDERS: [{"order_id": line["order_id"]} for line in detail],
        wp.DETAIL: detail,
        wp.REVENUE: list(revenue.values()),
    }


def _d(text: str | None) -> D | None:
    return None if text is None else D(text)


def test_samples_are_told_old_new_mixed_or_wrong() -> None:
    # 3 x 1.15 = 3.45 at list price, 3.105 -> 3.11 discounted (half up).
    old = _tables([(1, 7, "1.15", "3.45"), (2, 7, "1.15", "3.45")])
    assert rev.classify(0, old, placed_after=1).kind == "old"
    new = _tables([(1, 7, "1.15", "3.45"), (2, 7, "1.15", "3.11")])
    assert rev.classify(0, new, placed_after=1).kind == "new"
    late_at_list_price = _tables([(1, 7, "1.15", "3.11"), (2, 7, "1.15", "3.45")])
    assert rev.classify(0, late_at_list_price, placed_after=1).kind == "mixed"
    neither = _tables([(1, 7, "1.15", "3.40")])
    assert rev.classify(0, neither, placed_after=1).kind == "wrong"
    revenue_behind = _tables([(1, 7, "1.15", "3.45"), (2, 7, "1.15", "3.11")])
    revenue_behind[wp.REVENUE][0]["revenue"] = D("6.90")  # the old revenue, the new detail
    assert rev.classify(0, revenue_behind, placed_after=1).kind == "wrong"
    # an order for an item that had no price yet at its barrier: no amount, either way
    unpriced = [(3, 9, None, None)]
    assert rev.classify(0, _tables([(1, 7, "1.15", "3.45"), *unpriced]), 1).kind == "old"
    assert rev.classify(0, _tables([(2, 7, "1.15", "3.11"), *unpriced]), 1).kind == "new"
    amount_without_price = _tables([(1, 7, "1.15", "3.45"), (3, 9, None, "1.00")])
    assert rev.classify(0, amount_without_price, placed_after=1).kind == "wrong"


@pytest.mark.spark
@pytest.mark.slow
def test_revising_the_demo_detail_table_switches_readers_from_old_to_new_at_once(
    spark: Any, service: Service
) -> None:
    run = rev.Run(
        spark,
        service.url,
        catalog_properties=service.catalog_properties,
        state_dir=service.state_dir,
        orders_per_second=20,
    )
    outcome = rev.revise(run, warm_up_s=3, backlog_s=6, after_s=3)
    described = outcome.describe()

    kinds = outcome.kinds
    assert kinds["old"] and kinds["new"], described
    assert not kinds["mixed"] and not kinds["wrong"], [
        s for s in outcome.samples if s.kind in ("mixed", "wrong")
    ][:5]
    assert not outcome.went_back, described
    barriers = [s.barrier for s in outcome.samples]
    assert barriers == sorted(barriers), "consistent versions went back"
    assert len(outcome.samples) > 20, described
    # Only a read racing the swap's renaming may fail, never many.
    assert len(outcome.read_errors) <= 2, outcome.read_errors
    # After the swap the totals follow the corrected logic and the pipeline went on.
    assert outcome.final is not None and outcome.final.kind == "new", described
    assert outcome.final_barrier_after_swap_ms > 0, described
    assert outcome.backlog_ms > 0 and outcome.catch_up_s > 0, described
