"""Every topology edit keeps every answer already given, or is refused (DESIGN.md, "Every
state change keeps every answer already given"): a consistent version handed out for a
set of tables at or before a barrier never changes, the latest never goes back, no table
is named at a barrier it is not exact at. An edit that cannot keep that is 409 and
changes nothing, its message naming the way forward.

Each case below builds a small topology, takes the answers a reader may already hold,
makes one edit through ``PUT /jobs/{job}`` or ``DELETE /jobs/{job}``, and checks that
the edit is refused unchanged or that every answer is given again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from metaservice.clock import ManualClock
from tests.metaservice.helpers import (
    API,
    SLOT,
    T0,
    assert_error,
    barrier,
    commit,
    consistent,
    get_json,
    next_barrier,
    put_job,
    run_batch,
    source_and_derived,
    unchanged,
)

Answers = dict[str, Any]


def answers(client: TestClient, tables: str, barriers: list[int]) -> Answers:
    """What a reader may hold: the version at or before each barrier, and the latest."""
    held: Answers = {}
    for b in [*barriers, None]:
        r = consistent(client, tables, **({} if b is None else {"at_or_before": b}))
        held[str(b)] = r.json() if r.status_code == 200 else r.json()["code"]
    return held


def assert_kept(client: TestClient, tables: str, held: Answers) -> None:
    """Every version handed out is given again, or refused; none is different, and the
    latest does not go back."""
    for key, before in held.items():
        if not isinstance(before, dict):
            continue
        if key == "None":
            r = consistent(client, tables)
            assert r.status_code == 200, r.text
            assert r.json()["barrier"] >= before["barrier"], (before, r.json())
        # the version handed out, asked for again at its barrier
        r = consistent(client, tables, at_or_before=before["barrier"])
        if r.status_code == 200:
            assert r.json() == before, (key, before, r.json())
        else:  # refused: never a different answer
            assert r.status_code == 409, r.text


def a_source_with_history(client: TestClient, clock: ManualClock) -> list[int]:
    """``s`` writes ods.s: snapshot 101 at T0, 102 at T0+1s; the clock ends at T0+1.5s,
    in the slot of the last batch, so ods.s's frontier is T0. Returns the barriers."""
    put_job(client, "s", ["ods.s"])
    b0 = run_batch(client, "s", 0, {"ods.s": 101})
    clock.advance(SLOT)
    b1 = run_batch(client, "s", 1, {"ods.s": 102})
    clock.advance(SLOT // 2)
    return [b0, b1]


def delete_and_register_again(c: TestClient) -> None:
    assert c.delete(f"{API}/jobs/s").status_code == 204
    put_job(c, "s", ["ods.s"])


def move_to_another_source(c: TestClient) -> None:
    put_job(c, "s", ["ods.other"])
    put_job(c, "s2", ["ods.s"])


def delete_then_another_source(c: TestClient) -> None:
    assert c.delete(f"{API}/jobs/s").status_code == 204
    put_job(c, "s2", ["ods.s"])


def move_to_a_source_that_has_run(c: TestClient) -> None:
    put_job(c, "s2", ["ods.t"])
    run_batch(c, "s2", 0, {"ods.t": 901})
    put_job(c, "s", ["ods.other"])
    put_job(c, "s2", ["ods.t", "ods.s"])


@dataclass
class Kept:
    """An edit that is applied: every answer is kept, and the new writer's first batch
    stamps the table above every barrier it held."""

    name: str
    edit: Callable[[TestClient], None]
    writer: str  # the table's writer after the edit, a source


KEPT = [
    Kept("delete and register the source again", delete_and_register_again, "s"),
    Kept("move the output to another source", move_to_another_source, "s2"),
    Kept("delete, then another source takes the table", delete_then_another_source, "s2"),
    Kept("move the output to a source that has run", move_to_a_source_that_has_run, "s2"),
]


@pytest.mark.parametrize("case", KEPT, ids=[k.name for k in KEPT])
def test_a_source_table_changing_writer_keeps_every_answer_and_its_new_writer_starts_above(
    client: TestClient, clock: ManualClock, case: Kept
) -> None:
    barriers = a_source_with_history(client, clock)
    # The reader's answers, one of them leased
    lease = consistent(client, "ods.s", at_or_before=barriers[0], lease_seconds=600).json()
    assert lease["snapshots"] == {"ods.s": 101}
    held = answers(client, "ods.s", barriers)
    assert held["None"]["snapshots"] == {"ods.s": 101}

    case.edit(client)

    assert_kept(client, "ods.s", held)
    assert consistent(client, "ods.s", at_or_before=barriers[0]).json()["snapshots"] == {
        "ods.s": 101
    }
    # The new writer's batch, in the slot the old one last stamped, goes above it
    stamped = barrier(client, case.writer, 5)["barrier"]
    assert stamped > barriers[1], (stamped, barriers)
    clock.advance(2 * SLOT)
    assert_kept(client, "ods.s", held)


def test_a_source_taking_a_table_in_the_slot_of_its_history_starts_one_slot_ahead(
    client: TestClient, clock: ManualClock
) -> None:
    """A design consequence, pinned: the table's history reaches the clock's slot (its
    former writer stamped a batch there), and the new writer never stamps at or below
    its history, so its first batch in that slot gets the next slot's barrier, one
    slot ahead of the clock. Only its own barriers: another source in the slot gets the
    slot, the table's frontier stays at its history until the clock has passed the new
    barrier's slot, so no version and no reader's batch is ahead of the clock, and in
    the next slot the new writer's batches follow the clock again."""
    barriers = a_source_with_history(client, clock)  # the clock is in barriers[1]'s slot
    slot = barriers[1]
    put_job(client, "other", ["ods.o"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    move_to_another_source(client)  # s2 takes ods.s

    first = barrier(client, "s2", 0)["barrier"]
    assert first == slot + SLOT  # one slot ahead of the clock
    assert barrier(client, "other", 0)["barrier"] == slot  # other jobs keep the clock
    commit(client, "s2", 0, first, "ods.s", 501)
    assert get_json(client, "/jobs/s2")["frontier"] == slot  # not ahead of the clock
    assert consistent(client, "ods.s").json()["barrier"] == slot
    assert next_barrier(client, "d", after=0)["barrier"] <= slot
    assert barrier(client, "s2", 1)["barrier"] == first  # the same slot, the same barrier
    clock.advance(SLOT)  # the clock reaches the first barrier's slot
    commit(client, "s2", 1, first, "ods.s", 502)
    assert barrier(client, "s2", 2)["barrier"] == first  # the clock's slot again
    commit(client, "s2", 2, first, "ods.s", 503)
    assert get_json(client, "/jobs/s2")["frontier"] == slot  # that slot is not over yet
    clock.advance(SLOT)
    assert consistent(client, "ods.s").json() == {"barrier": first, "snapshots": {"ods.s": 503}}


def test_the_table_keeps_its_snapshots_when_its_writer_is_deleted(
    client: TestClient, clock: ManualClock
) -> None:
    barriers = a_source_with_history(client, clock)
    assert client.delete(f"{API}/jobs/s").status_code == 204
    page = get_json(client, "/tables/ods.s/snapshots")
    assert [(s["snapshot_id"], s["barrier"], s["job"]) for s in page["items"]] == [
        (101, barriers[0], None),
        (102, barriers[1], None),
    ]
    # its lineage names no batch: that was forgotten with the job
    r = client.get(f"{API}/lineage/snapshots/ods.s/101")
    assert_error(r, 404, "writer_deleted", field="snapshot_id")


@dataclass
class Refused:
    """An edit that could not keep the answers: 409 ``code``, nothing changed."""

    name: str
    setup: Callable[[TestClient, ManualClock], None]
    method: str
    path: str
    body: dict[str, Any] | None
    code: str
    says: str  # a way forward the message names


def _derived_table_writerless(c: TestClient, clock: ManualClock) -> None:
    source_and_derived(c, clock)
    put_job(c, "der", ["dw.other"], inputs=["ods.orders"])  # dw.detail has no writer now


def _derived_table_deleted_writer(c: TestClient, clock: ManualClock) -> None:
    source_and_derived(c, clock)
    c.delete(f"{API}/jobs/der").raise_for_status()


def _derived_that_ran_and_writerless_source_table(c: TestClient, clock: ManualClock) -> None:
    source_and_derived(c, clock)
    put_job(c, "s2", ["ods.s2"])
    run_batch(c, "s2", 0, {"ods.s2": 501})
    clock.advance(SLOT)
    put_job(c, "s2", ["ods.s3"])  # ods.s2 is left with its history
    put_job(c, "der", ["dw.detail"], inputs=["ods.orders"])


def _new_derived_and_writerless_source_table(c: TestClient, clock: ManualClock) -> None:
    """A derived job that has not run (its input has rows) and a source's table with a
    history, writerless: the job taking it on beside its own output would move that
    output's frontier past rows it never read."""
    put_job(c, "s", ["ods.orders"])
    run_batch(c, "s", 0, {"ods.orders": 101})
    put_job(c, "s2", ["ods.s2"])
    run_batch(c, "s2", 0, {"ods.s2": 501})
    clock.advance(SLOT)
    put_job(c, "s2", ["ods.s3"])  # ods.s2 is left with its history
    put_job(c, "fresh", ["dw.fresh"], inputs=["ods.orders"])


def _source_with_open_batch(c: TestClient, clock: ManualClock) -> None:
    put_job(c, "s", ["ods.s"])
    run_batch(c, "s", 0, {"ods.s": 101})
    clock.advance(2 * SLOT)
    put_job(c, "s", ["ods.other"])
    put_job(c, "s2", ["ods.t"])
    barrier(c, "s2", 0)  # open, not committed


def _source_holding_an_offline_grant(c: TestClient, clock: ManualClock) -> None:
    put_job(c, "s", ["ods.s"])
    clock.advance(SLOT)
    run_batch(c, "s", 0, {"ods.s": 101})  # the history reaches this slot
    put_job(c, "s", ["ods.other"])
    put_job(c, "s2", ["ods.t"])
    r = c.put(f"{API}/jobs/s2/offline-grant", json={"floor": 0})  # its floor: this slot
    assert r.status_code == 200, r.text


def _history_ahead_of_the_clock(c: TestClient, clock: ManualClock) -> None:
    put_job(c, "s", ["ods.s"])
    clock.advance(SLOT)
    r = c.put(f"{API}/jobs/s/offline-grant", json={"floor": 0})
    assert r.status_code == 200, r.text
    # an offline batch its driver gave a barrier two slots ahead of the clock
    claimed = c.post(f"{API}/jobs/s/batches/0/barrier", json={"barrier": T0 + 3 * SLOT})
    assert claimed.status_code == 200, claimed.text
    r = c.post(
        f"{API}/commits",
        json={
            "job": "s",
            "batch_id": 0,
            "barrier": T0 + 3 * SLOT,
            "table": "ods.s",
            "snapshot_id": 101,
        },
    )
    assert r.status_code == 200, r.text
    assert c.delete(f"{API}/jobs/s/offline-grant").status_code == 204
    put_job(c, "s", ["ods.other"])
    put_job(c, "s2", ["ods.t"])


REFUSED = [
    Refused(
        "a source holding an offline grant at or below the history takes the table",
        _source_holding_an_offline_grant,
        "PUT",
        "/jobs/s2",
        {"inputs": [], "outputs": ["ods.t", "ods.s"]},
        "offline_grant",
        "release the grant",
    ),
    Refused(
        "a source takes a table whose history is ahead of the clock",
        _history_ahead_of_the_clock,
        "PUT",
        "/jobs/s2",
        {"inputs": [], "outputs": ["ods.t", "ods.s"]},
        "history_ahead",
        "Retry once that slot has passed",
    ),
    Refused(
        "a source takes a derived table's history",
        _derived_table_writerless,
        "PUT",
        "/jobs/src2",
        {"inputs": [], "outputs": ["dw.detail"]},
        "history_kind",
        "derived job that has not run",
    ),
    Refused(
        "a source takes the history of a deleted derived writer",
        _derived_table_deleted_writer,
        "PUT",
        "/jobs/der",
        {"inputs": [], "outputs": ["dw.detail"]},
        "history_kind",
        "write a new table",
    ),
    Refused(
        "a derived job that has run takes a table with history",
        _derived_that_ran_and_writerless_source_table,
        "PUT",
        "/jobs/der",
        {"inputs": ["ods.orders"], "outputs": ["dw.detail", "ods.s2"]},
        "history_kind",
        "new derived job",
    ),
    Refused(
        "a derived job that has not run takes a table with history beside its own",
        _new_derived_and_writerless_source_table,
        "PUT",
        "/jobs/fresh",
        {"inputs": ["ods.orders"], "outputs": ["dw.fresh", "ods.s2"]},
        "history_gap",
        "a derived job of its own",
    ),
    Refused(
        "a new derived job takes a table with history beside a new one",
        _new_derived_and_writerless_source_table,
        "PUT",
        "/jobs/fresh2",
        {"inputs": ["ods.orders"], "outputs": ["dw.fresh2", "ods.s2"]},
        "history_gap",
        "'dw.fresh2', which has none that far",
    ),
    Refused(
        "a source with an open batch takes a table with history",
        _source_with_open_batch,
        "PUT",
        "/jobs/s2",
        {"inputs": [], "outputs": ["ods.t", "ods.s"]},
        "batch_open",
        "Let the batch commit",
    ),
]


@pytest.mark.parametrize("case", REFUSED, ids=[r.name for r in REFUSED])
def test_an_edit_that_would_change_an_answer_is_refused_and_changes_nothing(
    db_url: str, client: TestClient, clock: ManualClock, case: Refused
) -> None:
    case.setup(client, clock)
    with unchanged(db_url):
        r = client.request(case.method, f"{API}{case.path}", json=case.body)
        body = assert_error(r, 409, case.code, field="outputs")
    assert case.says in body["message"], body["message"]
    assert "Nothing was changed" in body["message"], body["message"]


def test_a_new_derived_writer_of_a_derived_table_starts_after_its_history(
    client: TestClient, clock: ManualClock
) -> None:
    """Deleting a derived job and registering it again: the table's history stays; the
    new job's first batch starts after the barrier the old one reached, so it never
    stamps the table at or below it, and no version names the table at a barrier the
    new job is not exact at."""
    barriers = source_and_derived(client, clock)
    held = answers(client, "dw.detail,ods.orders", [barriers["der0"]])
    assert held[str(barriers["der0"])]["snapshots"]["dw.detail"] == 201
    assert client.delete(f"{API}/jobs/der").status_code == 204
    view = put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    assert view["frontier"] == barriers["der0"]
    assert_kept(client, "dw.detail,ods.orders", {k: v for k, v in held.items() if k != "None"})
    clock.advance(SLOT)
    run_batch(client, "src", 2, {"ods.orders": 103})
    clock.advance(SLOT)
    plan = next_barrier(client, "der", after=barriers["der0"])
    assert plan["ready"] and plan["barrier"] > barriers["der0"], plan
    r = client.post(
        f"{API}/jobs/der/batches/0/barrier",
        json={"start": barriers["der0"], "end": plan["barrier"]},
    )
    assert r.status_code == 200, r.text
    assert [(i["from_barrier"], i["from_snapshot"]) for i in r.json()["inputs"]] == [
        (barriers["der0"], 102)
    ]


def a_derived_table_with_history(client: TestClient, clock: ManualClock) -> list[int]:
    """``der`` reads ods.orders and writes dw.detail and dw.extra: its batch 0 ends at
    T0+1s (it spans T0, so neither table is exact there), then the idle advance takes it
    on while ods.orders does not change. Returns the barriers a reader asks at."""
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der", ["dw.detail", "dw.extra"], inputs=["ods.orders"])
    run_batch(client, "src", 0, {"ods.orders": 101})
    clock.advance(SLOT)
    run_batch(client, "src", 1, {"ods.orders": 102})
    clock.advance(SLOT)
    d0 = run_batch(client, "der", 0, {"dw.detail": 201, "dw.extra": 301})
    assert d0 == T0 + SLOT
    clock.advance(3 * SLOT)
    advanced = consistent(client, "dw.extra").json()["barrier"]
    assert advanced > d0  # the idle advance's barrier: no Spark batch, no commit
    return [T0, d0, d0 + SLOT, advanced]


def delete_der_and_register_it_again(c: TestClient) -> None:
    assert c.delete(f"{API}/jobs/der").status_code == 204
    put_job(c, "der", ["dw.detail", "dw.extra"], inputs=["ods.orders"])


def move_extra_to_a_new_derived_job(c: TestClient) -> None:
    put_job(c, "der", ["dw.detail"], inputs=["ods.orders"])
    put_job(c, "der2", ["dw.extra"], inputs=["ods.orders"])


def move_extra_to_a_derived_job_of_other_inputs(c: TestClient) -> None:
    put_job(c, "s2", ["ods.other"])
    put_job(c, "der", ["dw.detail"], inputs=["ods.orders"])
    put_job(c, "der2", ["dw.extra"], inputs=["ods.other"])


@dataclass
class Takeover:
    """A new derived writer takes dw.extra: ``writer`` reads ``source``'s ``input``."""

    name: str
    edit: Callable[[TestClient], None]
    writer: str
    source: str = "src"
    input: str = "ods.orders"


DERIVED_TAKEOVERS = [
    Takeover("delete and register again", delete_der_and_register_it_again, "der"),
    Takeover("move an output to a new derived job", move_extra_to_a_new_derived_job, "der2"),
    Takeover(
        "move to a derived job of other inputs",
        move_extra_to_a_derived_job_of_other_inputs,
        "der2",
        "s2",
        "ods.other",
    ),
]


@pytest.mark.parametrize("case", DERIVED_TAKEOVERS, ids=[t.name for t in DERIVED_TAKEOVERS])
def test_a_derived_table_taken_by_a_new_derived_writer_answers_every_version_again(
    client: TestClient, clock: ManualClock, case: Takeover
) -> None:
    """Exactness is the table's, not its writer's (N2): the versions handed out for a
    derived table at or below its hand-over, at a barrier its former writer committed or
    was advanced to, are given again, unchanged, by the new writer's table (they were 409
    ``no_consistent_version``, the new writer having committed none of them); where it
    was not exact (inside the former writer's batch) it stays 409; the new writer's own
    barriers come after, and no version names the table at a barrier it is not exact at."""
    barriers = a_derived_table_with_history(client, clock)
    sets = ["dw.extra", "dw.extra,ods.orders"]
    held = {tables: answers(client, tables, barriers) for tables in sets}
    assert held["dw.extra"][str(T0)] == "no_consistent_version"  # inside batch 0
    assert held["dw.extra"][str(barriers[1])]["snapshots"] == {"dw.extra": 301}
    assert held["dw.extra"][str(barriers[3])]["barrier"] == barriers[3]

    case.edit(client)

    for tables in sets:
        for key, before in held[tables].items():
            at = {} if key == "None" else {"at_or_before": int(key)}
            r = consistent(client, tables, **at)
            if isinstance(before, dict):
                assert r.status_code == 200, (tables, key, r.text)
                assert r.json() == before, (tables, key, before, r.json())
            else:
                assert r.status_code == 409 and r.json()["code"] == before, (tables, key, r.text)
    # The new writer goes on above the history; the table is exact at its barriers too.
    writer = case.writer
    assert get_json(client, f"/jobs/{writer}")["frontier"] == barriers[3]
    run_batch(client, case.source, 7, {case.input: 701})
    clock.advance(SLOT)
    plan = next_barrier(client, writer, after=barriers[3])
    assert plan["ready"] and plan["barrier"] > barriers[3], plan
    opened = client.post(
        f"{API}/jobs/{writer}/batches/0/barrier",
        json={"start": barriers[3], "end": plan["barrier"]},
    )
    assert opened.status_code == 200, opened.text
    outputs = {"dw.detail": 202, "dw.extra": 302} if writer == "der" else {"dw.extra": 302}
    for table, snapshot in outputs.items():
        commit(client, writer, 0, plan["barrier"], table, snapshot)
    latest = consistent(client, "dw.extra").json()
    assert latest["barrier"] >= plan["barrier"] and latest["snapshots"] == {"dw.extra": 302}
    again = consistent(client, "dw.extra", at_or_before=barriers[3]).json()
    assert again == held["dw.extra"][str(barriers[3])]


def test_a_source_table_taken_by_a_derived_job_keeps_the_sources_answers(
    client: TestClient, clock: ManualClock
) -> None:
    """A source's table is exact at every barrier up to its frontier; taken by a derived
    job that has not run, it stays so up to the hand-over (``source_until``)."""
    barriers = a_source_with_history(client, clock)
    clock.advance(2 * SLOT)
    put_job(client, "up", ["ods.up"])
    run_batch(client, "up", 0, {"ods.up": 1})
    clock.advance(SLOT)
    held = answers(client, "ods.s", [*barriers, barriers[1] + SLOT])
    assert all(isinstance(v, dict) for v in held.values()), held

    put_job(client, "s", ["ods.other"])
    put_job(client, "d", ["ods.s"], inputs=["ods.up"])

    for key, before in held.items():
        at = {} if key == "None" else {"at_or_before": int(key)}
        r = consistent(client, "ods.s", **at)
        assert r.status_code == 200 and r.json() == before, (key, before, r.text)


def test_changing_the_inputs_of_a_job_that_never_ran_drops_its_plans(
    client: TestClient, clock: ManualClock
) -> None:
    """A plan made for the old inputs would end the job's first batch where they
    allowed; after the edit the end is chosen among the new inputs."""
    source_and_derived(client, clock)  # der is exact at T0+1s
    run_batch(client, "src", 2, {"ods.orders": 103})  # der has work: it is not idle
    clock.advance(2 * SLOT)  # ods.orders is complete up to T0+3s
    put_job(client, "new", ["dws.new"], inputs=["ods.orders"])
    first = next_barrier(client, "new", after=0)
    assert first["ready"] and first["barrier"] > T0 + SLOT, first
    put_job(client, "new", ["dws.new"], inputs=["dw.detail"])
    again = next_barrier(client, "new", after=0)
    assert again["ready"] and again["barrier"] == T0 + SLOT, again
