"""The per-batch step timings the sink logs (spark_barrier.steps), without Spark."""

from __future__ import annotations

import logging
import time

from spark_barrier.steps import log_batch, recording, step


def test_steps_add_up_per_name_and_cost_nothing_outside_a_batch(caplog):
    with step("write"):  # no batch being recorded: nothing to add to
        pass
    with recording() as steps:
        with step("write"):
            time.sleep(0.02)
        with step("write"):
            time.sleep(0.02)
        with step("commit"):
            pass
    assert set(steps) == {"write", "commit"}
    assert steps["write"] >= 40
    caplog.set_level(logging.INFO, logger="spark_barrier.steps")
    log_batch("enrich", 7, 1_700_000_000_000, steps, total_ms=95.0)
    (record,) = [r for r in caplog.records if r.name == "spark_barrier.steps"]
    assert record.steps == steps and record.job == "enrich" and record.batch_id == 7
    assert record.total_ms == 95.0
    assert "enrich batch 7 (barrier 1700000000000): write" in record.getMessage()
    assert record.getMessage().endswith("; total 95 ms")


def test_a_step_that_raises_is_still_timed():
    with recording() as steps:
        try:
            with step("commit"):
                raise RuntimeError("conflict")
        except RuntimeError:
            pass
    assert "commit" in steps
