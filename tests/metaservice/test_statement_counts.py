"""SQL statements per request on the hot paths, pinned so they cannot creep back (issue 13).

Each test drives the service over its ASGI app (the same path a job's requests take)
and counts every statement the app's engine sends (SQLAlchemy's
``before_cursor_execute``: on SQLite that includes ``BEGIN IMMEDIATE``; COMMIT is not
a statement). The bounds are today's counts: lower them when a change removes
statements, never raise them without saying why in the commit.

``METASERVICE_PRINT_COUNTS=1`` prints the counts measured (``pytest -s``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event, text

from metaservice.barriers import watermark
from tests.metaservice.helpers import API, SLOT, barrier, commit, put_job, report

# operation -> (SQLite, PostgreSQL) upper bounds
BOUNDS: dict[str, tuple[int, int]] = {
    # on PostgreSQL the watermark's advisory lock, taken shared before S is read (issue
    # 32: a consistent-version read no longer seals, test_reads_never_write.py)
    "source barrier": (7, 7),
    "source report": (7, 6),
    # One request per batch: batch k+1's barrier carrying batch k's report, the
    # listener's progress and the offline-grant promise, in one transaction; the four
    # requests it replaces sent 7 + 7 + 3 + 3 (SQLite) and 6 + 6 + 2 + 2 (PostgreSQL)
    # before the watermark. The progress and the promise take the job's row as the
    # barrier locked it (they read it again: 18, 18); S is read once per transaction,
    # under its lock taken once, and the grant takes the barrier's read; the progress and
    # the promise change the job's row in one UPDATE at the commit (16, 16 before both)
    "source barrier carrying report, progress, promise": (14, 14),
    "derived barrier": (9, 8),
    "derived report": (8, 7),
    "next-barrier": (11, 10),
    "batched reports, 1": (7, 6),
    "batched reports, 10": (7, 6),
    "batched reports, 100": (7, 6),
    "offline claims, 1": (8, 7),
    "offline claims, 100": (8, 7),
    # could_advance walks the upstream a layer at a time (it sent 119 / 117 per job);
    # the read that decides no write is needed answers too, and the tables come with
    # their writers in one statement (it sent 13 / 11)
    "consistent version, 50 tables": (9, 8),
    # The idle upstream is advanced with a statement or two per step for the whole
    # closure, not about 12 per job and path to it (it sent 463 / 462, then 25 / 22).
    # Where readers catch up (no advancer: a ManualClock), the write step raises the
    # watermark under its exclusive lock (one more on PostgreSQL) instead of sealing
    # sources; with the advancer, the read writes nothing (test_reads_never_write.py)
    "consistent version, 50 tables, sealing": (22, 20),
    # six diamonds (64 paths): as many statements as a chain as deep; most are the
    # read that decides to write (could_advance walks a layer at a time, 12 layers)
    "consistent version, stacked diamonds, sealing": (57, 54),
    "tables, a page of 50": (7, 6),
    # the readable tables, the consistent version's read (as a read answers it), the
    # check against a swap under the pins lock (PostgreSQL; SQLite's serialised writers
    # need only the ids) and two rows: flat in the table count (it sealed first, wrote
    # two rows per table and locked every table's row)
    "catalog config, 50 tables": (13, 14),
    "catalog request renewing its session": (8, 7),
    # the topology version (and whether anything was observed) beside the cached graph;
    # on PostgreSQL outside a transaction (it sent 3 in one, and rebuilt nothing either)
    "lineage, cached graph": (2, 1),
    # the job's row read and updated; the view adds its edges and frontier
    "listener event": (6, 5),
    "listener event, return=minimal": (3, 2),
}
# How much a batched report request may grow from 10 to 100 reports (10 jobs): not at
# all (set-based reads, then one INSERT and executemany UPDATEs as plain statements; the
# ORM updated rows one by one on SQLite, where pysqlite reports no executemany rowcount).
BATCH_GROWTH = (0, 0)


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, *_: Any) -> None:
        self.count += 1


@contextmanager
def counting(client: TestClient) -> Iterator[Counter]:
    engine = client.app.state.services.db.engine  # type: ignore[attr-defined]
    counter = Counter()
    event.listen(engine, "before_cursor_execute", counter)
    try:
        yield counter
    finally:
        event.remove(engine, "before_cursor_execute", counter)


def check(client: TestClient, db_url: str, operation: str, count: int) -> None:
    bound = BOUNDS[operation][0 if db_url.startswith("sqlite") else 1]
    if os.environ.get("METASERVICE_PRINT_COUNTS"):
        kind = "sqlite" if db_url.startswith("sqlite") else "postgres"
        print(f"\nSTATEMENTS {kind:8} {operation:40} {count}")
    assert count <= bound, f"{operation}: {count} SQL statements, at most {bound} allowed"


def counted(client: TestClient, call: Any) -> tuple[Any, int]:
    with counting(client) as counter:
        result = call()
    return result, counter.count


def post_ok(client: TestClient, path: str, body: Any = None) -> Any:
    r = client.post(API + path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def get_ok(client: TestClient, path: str, params: Any = None) -> Any:
    r = client.get(API + path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_source_batch_cycle(client, clock, db_url):
    put_job(client, "src", outputs=["ods.a"])
    for batch_id in range(3):  # warm up: the first batch and slot differ
        b = barrier(client, "src", batch_id)["barrier"]
        commit(client, "src", batch_id, b, "ods.a", 100 + batch_id)
        clock.advance(SLOT)
    view, n_barrier = counted(client, lambda: barrier(client, "src", 3))
    result, n_report = counted(
        client, lambda: commit(client, "src", 3, view["barrier"], "ods.a", 103)
    )
    assert result["status"] == "recorded" and result["batch_committed"]
    check(client, db_url, "source barrier", n_barrier)
    check(client, db_url, "source report", n_report)


def test_source_batch_carrying_its_predecessors_parts(client, clock, db_url):
    put_job(client, "src", outputs=["ods.a"])
    for batch_id in range(3):  # warm up: the first batch and slot differ
        b = barrier(client, "src", batch_id)["barrier"]
        commit(client, "src", batch_id, b, "ods.a", 100 + batch_id)
        clock.advance(SLOT)
    b3 = barrier(client, "src", 3)["barrier"]
    clock.advance(SLOT)
    body = {
        "query_id": "q",
        "reports": [report("src", 3, b3, "ods.a", 103)],
        "progress": {"event": "progress", "run_id": "r", "batch_id": 3},
        "floor": b3 + SLOT,
    }
    view, n = counted(client, lambda: post_ok(client, "/jobs/src/batches/4/barrier", body))
    carried = view["carried"]
    assert carried["reports"]["recorded"] == 1 and carried["progress"] and carried["grant"]
    check(client, db_url, "source barrier carrying report, progress, promise", n)


def _derived_pipeline(client, clock) -> None:
    put_job(client, "src", outputs=["ods.a"])
    put_job(client, "der", inputs=["ods.a"], outputs=["dwd.b"])


def _derived_step(client, clock, batch_id: int, measure: dict[str, int] | None = None) -> None:
    b = barrier(client, "src", batch_id)["barrier"]
    commit(client, "src", batch_id, b, "ods.a", 100 + batch_id)
    clock.advance(SLOT)

    def count(name: str, call: Any) -> Any:
        if measure is None:
            return call()
        result, n = counted(client, call)
        measure[name] = n
        return result

    nxt = count("next-barrier", lambda: get_ok(client, "/jobs/der/next-barrier"))
    assert nxt["ready"], nxt
    view = count(
        "derived barrier",
        lambda: post_ok(
            client,
            f"/jobs/der/batches/{batch_id}/barrier",
            {"start": nxt["start_barrier"], "end": nxt["barrier"]},
        ),
    )
    assert view["barrier"] == nxt["barrier"]
    result = count(
        "derived report",
        lambda: commit(client, "der", batch_id, view["barrier"], "dwd.b", 500 + batch_id),
    )
    assert result["batch_committed"]


def test_derived_batch_cycle_and_next_barrier(client, clock, db_url):
    _derived_pipeline(client, clock)
    for batch_id in range(3):
        _derived_step(client, clock, batch_id)
    measured: dict[str, int] = {}
    _derived_step(client, clock, 3, measured)
    for name, n in measured.items():
        check(client, db_url, name, n)


def _batched(client, clock, jobs: int, per_job: int, first_batch: int) -> int:
    reports = []
    for j in range(jobs):
        for k in range(per_job):
            batch_id = first_batch + k
            b = barrier(client, f"w{j}", batch_id)["barrier"]
            reports.append(report(f"w{j}", batch_id, b, f"ods.w{j}", 10_000 * j + batch_id))
    body, n = counted(client, lambda: post_ok(client, "/commits/batch", {"commits": reports}))
    assert body["recorded"] == len(reports), body
    return n


def test_batched_reports_cost_does_not_grow_with_the_reports(client, clock, db_url):
    for j in range(10):
        put_job(client, f"w{j}", outputs=[f"ods.w{j}"])
    _batched(client, clock, 10, 1, 0)  # warm up
    clock.advance(SLOT)
    n1 = _batched(client, clock, 1, 1, 1)
    n10 = _batched(client, clock, 10, 1, 2)
    clock.advance(SLOT)
    n100 = _batched(client, clock, 10, 10, 3)
    check(client, db_url, "batched reports, 1", n1)
    check(client, db_url, "batched reports, 10", n10)
    check(client, db_url, "batched reports, 100", n100)
    assert n100 - n10 <= BATCH_GROWTH[0 if db_url.startswith("sqlite") else 1], (n10, n100)


def test_offline_claims_cost_does_not_grow_with_the_claims(client, clock, db_url):
    """A backlog of claims delivered after an outage: one request per delivery, the
    batches it opens written together (one output count, clock raise and INSERT)."""
    put_job(client, "src", outputs=["ods.a"])
    r = client.put(API + "/jobs/src/offline-grant", json={"floor": 0})
    assert r.status_code == 200, r.text
    floor = r.json()["floor"]
    clock.advance(200 * SLOT)

    def claims(first: int, count: int) -> int:
        body = {
            "claims": [
                {"batch_id": first + k, "barrier": floor + (first + k) * SLOT} for k in range(count)
            ]
        }
        out, n = counted(client, lambda: post_ok(client, "/jobs/src/claims", body))
        assert len(out["results"]) == count
        return n

    claims(0, 2)  # warm up
    n1 = claims(2, 1)
    n100 = claims(3, 100)
    check(client, db_url, "offline claims, 1", n1)
    check(client, db_url, "offline claims, 100", n100)
    assert n100 == n1, (n1, n100)


def _fifty_tables(client, clock) -> list[str]:
    """20 sources, 20 derived jobs reading two sources each, 10 reading two of those."""
    sources = [f"ods.s{i:02d}" for i in range(20)]
    layer1 = [f"dwd.d{i:02d}" for i in range(20)]
    layer2 = [f"dws.e{i:02d}" for i in range(10)]
    for i, t in enumerate(sources):
        put_job(client, f"s{i:02d}", outputs=[t])
    for i, t in enumerate(layer1):
        put_job(client, f"d{i:02d}", inputs=[sources[i], sources[(i + 1) % 20]], outputs=[t])
    for i, t in enumerate(layer2):
        put_job(client, f"e{i:02d}", inputs=[layer1[2 * i], layer1[2 * i + 1]], outputs=[t])
    for step in range(2):
        for i, t in enumerate(sources):
            b = barrier(client, f"s{i:02d}", step)["barrier"]
            commit(client, f"s{i:02d}", step, b, t, 1000 * i + step)
        clock.advance(SLOT)
        for prefix, tables in (("d", layer1), ("e", layer2)):
            for i, t in enumerate(tables):
                nxt = get_ok(client, f"/jobs/{prefix}{i:02d}/next-barrier")
                assert nxt["ready"], nxt
                view = post_ok(
                    client,
                    f"/jobs/{prefix}{i:02d}/batches/{step}/barrier",
                    {"start": nxt["start_barrier"], "end": nxt["barrier"]},
                )
                commit(
                    client, f"{prefix}{i:02d}", step, view["barrier"], t, 50_000 + 100 * i + step
                )
    return sources + layer1 + layer2


def test_consistent_version_of_fifty_tables(client, clock, db_url):
    tables = _fifty_tables(client, clock)
    clock.advance(SLOT)
    params = {"tables": ",".join(tables)}
    sealing, n_seal = counted(client, lambda: get_ok(client, "/versions/consistent", params))
    read, n_read = counted(client, lambda: get_ok(client, "/versions/consistent", params))
    assert read == sealing and len(read["snapshots"]) == 50
    check(client, db_url, "consistent version, 50 tables, sealing", n_seal)
    check(client, db_url, "consistent version, 50 tables", n_read)


def test_a_page_of_tables_costs_what_two_tables_cost(client, clock, db_url):
    tables = _fifty_tables(client, clock)
    clock.advance(SLOT)
    # two tables, one with a derived writer and one with a source writer, as on the page
    two, n_two = counted(client, lambda: get_ok(client, "/tables", {"limit": 2, "offset": 29}))
    page, n_page = counted(client, lambda: get_ok(client, "/tables", {"limit": 50}))
    assert page["total"] == 50 and [t["name"] for t in page["items"]] == sorted(tables)
    assert two["items"] == page["items"][29:31]
    assert [t["writer"][0] for t in two["items"]] == ["e", "s"]
    # every table committed two snapshots; the page shows each one's newest
    newest = {t["name"]: (t["latest_snapshot"], t["latest_barrier"]) for t in page["items"]}
    for t in page["items"]:
        snaps = get_ok(client, f"/tables/{t['name']}/snapshots")["items"]
        assert newest[t["name"]] == (snaps[-1]["snapshot_id"], snaps[-1]["barrier"])
    check(client, db_url, "tables, a page of 50", n_page)
    assert n_page == n_two, (n_two, n_page)


def test_listener_event_costs_less_without_the_job_view(client, clock, db_url):
    """The Spark listener asks for no view back (``Prefer: return=minimal``): the event
    is the job's row read and updated; the view adds the edges and the frontier."""
    _derived_pipeline(client, clock)
    for batch_id in range(2):
        _derived_step(client, clock, batch_id)
    sent = iter(range(1_000))

    def event(job: str, headers: dict[str, str]) -> int:
        # a new batch id each time: the row changes, as with a running query's progress
        body = {"event": "progress", "run_id": "r1", "batch_id": next(sent)}
        r = client.post(f"{API}/jobs/{job}/events", json=body, headers=headers)
        assert r.status_code == (204 if headers else 200), r.text
        return r.status_code

    for job in ("src", "der"):
        event(job, {})  # warm up
        _, n_view = counted(client, lambda job=job: event(job, {}))
        _, n_minimal = counted(client, lambda job=job: event(job, {"Prefer": "return=minimal"}))
        check(client, db_url, "listener event", n_view)
        check(client, db_url, "listener event, return=minimal", n_minimal)
        assert n_minimal < n_view, (job, n_minimal, n_view)


def _raise_watermark(client: TestClient) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    services.db.write(lambda session: watermark.raise_to_closed_slot(session, services.ctx))


def _diamonds(
    client, prefix: str, levels: int, paths: bool = True
) -> tuple[str, list[tuple[str, str]]]:
    """A source under ``levels`` diamonds: each level's two jobs read the table below,
    and a third joins them (2 ** levels paths from the top to the source); without
    ``paths``, a chain as deep (one job per level reads the table below, a second reads
    it). The source commits a batch; the top table and the derived jobs are returned,
    upstream first."""
    put_job(client, f"{prefix}src", outputs=[f"ods.{prefix}src"])
    below = f"ods.{prefix}src"
    jobs: list[tuple[str, str]] = []
    for level in range(levels):
        left, right, top = (f"{prefix}{side}{level}" for side in ("l", "r", "j"))
        sides = (left, right) if paths else (left,)
        for side in sides:
            put_job(client, side, inputs=[below], outputs=[f"dwd.{side}"])
        put_job(client, top, inputs=[f"dwd.{s}" for s in sides], outputs=[f"dws.{top}"])
        jobs += [(side, f"dwd.{side}") for side in sides] + [(top, f"dws.{top}")]
        below = f"dws.{top}"
    b = barrier(client, f"{prefix}src", 0)["barrier"]
    commit(client, f"{prefix}src", 0, b, f"ods.{prefix}src", 1)
    return below, jobs


def _run_first_batches(client, jobs: list[tuple[str, str]]) -> None:
    for n, (job, table) in enumerate(jobs):  # upstream first
        nxt = get_ok(client, f"/jobs/{job}/next-barrier")
        assert nxt["ready"], nxt
        body = {"start": nxt["start_barrier"], "end": nxt["barrier"]}
        view = post_ok(client, f"/jobs/{job}/batches/0/barrier", body)
        commit(client, job, 0, view["barrier"], table, 100 + n)


def test_an_idle_upstream_is_advanced_once_per_job_whatever_the_paths(client, clock, db_url):
    """Advancing idle jobs for a consistent version costs the same for a stack of six
    diamonds (64 paths to the source) as for a chain as deep (one path): each job is
    looked at once, not once per path; and every job of the stack reaches the source's
    frontier in one read."""
    stacks = {paths: _diamonds(client, f"k{paths}", 6, paths == 64) for paths in (1, 64)}
    clock.advance(SLOT)
    for top, jobs in stacks.values():
        _run_first_batches(client, jobs)
        assert get_ok(client, "/versions/consistent", {"tables": top})["barrier"] > 0
    clock.advance(5 * SLOT)
    # The watermark is raised once for every job (by whichever read comes first): raised
    # here, so that both stacks' reads cost the advance of their jobs alone.
    _raise_watermark(client)
    counts = {}
    for paths, (top, jobs) in stacks.items():
        version, counts[paths] = counted(
            client, lambda top=top: get_ok(client, "/versions/consistent", {"tables": top})
        )
        source = get_ok(client, f"/jobs/k{paths}src")["frontier"]
        assert version["barrier"] == source
        for job, _ in jobs:
            assert get_ok(client, f"/jobs/{job}")["frontier"] == source, job
    assert counts[1] == counts[64], counts
    check(client, db_url, "consistent version, stacked diamonds, sealing", counts[64])


def test_lineage_from_the_cached_graph_is_one_statement(client, clock, db_url):
    tables = _fifty_tables(client, clock)
    params = {"table": tables[-1], "direction": "upstream"}
    first = get_ok(client, "/lineage", params)  # builds this replica's graph
    again, n = counted(client, lambda: get_ok(client, "/lineage", params))
    assert again == first and len(first["nodes"]) > 3
    check(client, db_url, "lineage, cached graph", n)


def test_a_catalog_session_on_fifty_tables_costs_a_read_and_two_rows(client, clock, db_url):
    """Configuring a catalog session reads the consistent version and writes its lease
    and its session, one row each (a lease of all tables, the tables as one column):
    no statement, row lock or row per table. Renewing takes one lock and writes one row."""
    tables = _fifty_tables(client, clock)
    clock.advance(SLOT)
    get_ok(client, "/versions/consistent", {"tables": ",".join(tables)})  # seals
    _, n_read = counted(
        client, lambda: get_ok(client, "/versions/consistent", {"tables": ",".join(tables)})
    )
    r, n_config = counted(client, lambda: client.get("/iceberg/v1/config"))
    assert r.status_code == 200, r.text
    prefix = r.json()["overrides"]["prefix"]
    check(client, db_url, "catalog config, 50 tables", n_config)
    assert n_config <= n_read + 6, (n_read, n_config)
    engine = client.app.state.services.db.engine  # type: ignore[attr-defined]
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT (SELECT count(*) FROM leases), (SELECT count(*) FROM lease_snapshots)")
        ).one()
    assert tuple(rows) == (1, 0), rows  # one lease row, no row per table
    listed = client.get(f"/iceberg/v1/{prefix}/namespaces")
    assert listed.status_code == 200 and listed.json()["namespaces"], listed.text
    clock.advance(
        client.app.state.services.ctx.settings.catalog_session_idle_seconds * 600  # type: ignore[attr-defined]
    )
    r, n_renew = counted(client, lambda: client.get(f"/iceberg/v1/{prefix}/namespaces"))
    assert r.status_code == 200, r.text
    check(client, db_url, "catalog request renewing its session", n_renew)
    if os.environ.get("METASERVICE_PRINT_COUNTS"):
        print(f"\nSTATEMENTS consistent read beside it: {n_read}")
