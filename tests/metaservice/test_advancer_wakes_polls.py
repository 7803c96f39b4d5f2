"""The per-slot advancer wakes the long polls once its tick moved something: an idle
source's frontier moves with the watermark the tick raised, which no request notifies,
so a poll waiting on it would otherwise look again only at its resync."""

from __future__ import annotations

import asyncio
import threading
import time

from metaservice.barriers.advancer import Advancer
from metaservice.barriers.changes import EVERY_JOB, Changes
from tests.metaservice.helpers import SLOT, put_job, run_batch


def _waiting(changes: Changes, names: list[str], timeout: float) -> tuple[threading.Thread, list]:
    """A wait on ``names`` in an event loop of its own thread; its outcome and seconds."""
    outcome: list = []
    started = threading.Event()

    def run() -> None:
        async def wait() -> None:
            seen = changes.mark()
            began = time.monotonic()
            waiting = asyncio.ensure_future(changes.wait(names, since=seen, timeout=timeout))
            await asyncio.sleep(0)  # the wait has registered (and set the loop)
            started.set()
            outcome.append((await waiting, time.monotonic() - began))

        asyncio.run(wait())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(5)
    return thread, outcome


def test_every_job_wakes_a_wait_on_any_names() -> None:
    changes = Changes()
    thread, outcome = _waiting(changes, ["src_a", "src_b"], timeout=10)
    changes.notify_threadsafe([EVERY_JOB])
    thread.join(5)
    assert outcome and outcome[0][0] is True and outcome[0][1] < 5, outcome


def test_a_wait_begun_after_every_job_moved_returns_at_once() -> None:
    changes = Changes()
    seen = changes.mark()
    changes.notify([EVERY_JOB])
    assert asyncio.run(changes.wait(["src"], since=seen, timeout=10)) is True


def test_a_tick_that_raised_the_watermark_wakes_the_polls(client, clock) -> None:
    services = client.app.state.services
    put_job(client, "src", ["ods.s"])
    run_batch(client, "src", 0, {"ods.s": 1})
    advancer = Advancer(services.db, services.ctx, services.changes.notify_threadsafe)
    advancer.run_once()  # whatever the first tick finds to do
    thread, outcome = _waiting(services.changes, ["src"], timeout=10)
    clock.advance(2 * SLOT)  # a slot closed: the next tick raises the watermark
    done = advancer.run_once()
    assert done.raised is not None
    thread.join(5)
    assert outcome and outcome[0][0] is True and outcome[0][1] < 5, outcome


def test_a_tick_that_moved_nothing_wakes_no_poll(client, clock) -> None:
    services = client.app.state.services
    put_job(client, "src", ["ods.s"])
    advancer = Advancer(services.db, services.ctx, services.changes.notify_threadsafe)
    advancer.run_once()
    thread, outcome = _waiting(services.changes, ["src"], timeout=1.0)
    done = advancer.run_once()  # the same slot: nothing to raise or advance
    assert done.raised is None and not done.advanced
    thread.join(5)
    assert outcome and outcome[0][0] is False, outcome
