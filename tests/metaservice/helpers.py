"""Shared helpers for the API tests: request shortcuts, error checks, database snapshots."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect, text

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.db import normalise_url
from metaservice.settings import Settings

API = "/api/v1"
T0 = 1_700_000_000_000  # the ManualClock's start, on the 1 s grid
SLOT = 1000
_UNSET = object()


# -- the database, table by table -------------------------------------------------------


def db_state(db_url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the service's database, sorted: compare before and after."""
    engine = create_engine(normalise_url(db_url))
    try:
        names = sorted(inspect(engine).get_table_names())
        state = {}
        with engine.connect() as conn:
            for name in names:
                rows = conn.execute(text(f'SELECT * FROM "{name}"')).all()
                state[name] = sorted((tuple(r) for r in rows), key=repr)
        return state
    finally:
        engine.dispose()


@contextmanager
def unchanged(db_url: str) -> Iterator[None]:
    """Asserts that the block leaves every row of the database as it was."""
    before = db_state(db_url)
    assert before["clock"], "the database should be migrated and hold the clock row"
    yield
    after = db_state(db_url)
    assert after == before, _diff(before, after)


def _diff(before: dict[str, list[Any]], after: dict[str, list[Any]]) -> str:
    lines = ["database changed:"]
    for table in sorted(set(before) | set(after)):
        old, new = before.get(table, []), after.get(table, [])
        if old != new:
            lines.append(
                f"  {table}: -{[r for r in old if r not in new]} +{[r for r in new if r not in old]}"
            )
    return "\n".join(lines)


# -- errors -------------------------------------------------------------------------------


def assert_error(response: Any, status: int, code: str, field: Any = _UNSET) -> dict[str, Any]:
    """The response is the JSON error ``{"code", "message"[, "field"]}`` with this status."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"], body
    if field is not _UNSET:
        assert body.get("field") == field, body
    return body  # type: ignore[no-any-return]


# -- requests -----------------------------------------------------------------------------


def put_job(
    client: TestClient,
    name: str,
    outputs: Sequence[str],
    inputs: Sequence[str] = (),
    description: str = "",
) -> dict[str, Any]:
    r = client.put(
        f"{API}/jobs/{name}",
        json={"inputs": list(inputs), "outputs": list(outputs), "description": description},
    )
    assert r.status_code in (200, 201), r.text
    return r.json()  # type: ignore[no-any-return]


def barrier(client: TestClient, job: str, batch_id: int) -> dict[str, Any]:
    r = client.post(f"{API}/jobs/{job}/batches/{batch_id}/barrier")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def report(
    job: str, batch_id: int, barrier_: int, table: str, snapshot_id: int | None
) -> dict[str, Any]:
    return {
        "job": job,
        "batch_id": batch_id,
        "barrier": barrier_,
        "table": table,
        "snapshot_id": snapshot_id,
    }


def commit(
    client: TestClient, job: str, batch_id: int, barrier_: int, table: str, snapshot_id: int | None
) -> dict[str, Any]:
    r = client.post(f"{API}/commits", json=report(job, batch_id, barrier_, table, snapshot_id))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def run_batch(client: TestClient, job: str, batch_id: int, snapshots: dict[str, int | None]) -> int:
    """Ask for a batch's barrier and report a commit to each table; returns the barrier."""
    b = barrier(client, job, batch_id)["barrier"]
    for table, snapshot in snapshots.items():
        commit(client, job, batch_id, b, table, snapshot)
    return b  # type: ignore[no-any-return]


def get_json(client: TestClient, path: str, **params: Any) -> Any:
    r = client.get(f"{API}{path}", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def next_barrier(client: TestClient, job: str, **params: Any) -> Any:
    return get_json(client, f"/jobs/{job}/next-barrier", **params)


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``call()`` started in a daemon thread; the list gets its answer."""
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    thread.start()
    return thread, answers


def consistent(client: TestClient, tables: str, **params: Any) -> Any:
    return client.get(f"{API}/versions/consistent", params={"tables": tables, **params})


# -- topologies ---------------------------------------------------------------------------


def source_and_derived(client: TestClient, clock: ManualClock) -> dict[str, int]:
    """``src`` writes ods.orders (snapshots 101 at T0, 102 at T0+1s); ``der`` reads it and
    writes dw.detail, and has committed batch 0 at barrier T0+1s as snapshot 201.
    The clock ends at T0+2s."""
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    b0 = run_batch(client, "src", 0, {"ods.orders": 101})
    clock.advance(SLOT)
    b1 = run_batch(client, "src", 1, {"ods.orders": 102})
    clock.advance(SLOT)
    d0 = run_batch(client, "der", 0, {"dw.detail": 201})
    assert (b0, b1, d0) == (T0, T0 + SLOT, T0 + SLOT)
    return {"src0": b0, "src1": b1, "der0": d0}


@contextmanager
def custom_client(db_url: str, clock: ManualClock, **settings: Any) -> Iterator[TestClient]:
    """The service on the test's database with some settings changed."""
    app = create_app(Settings(db_url=db_url, **settings), clock)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@contextmanager
def locked_for_update(db_url: str, select: str, **params: Any) -> Iterator[None]:
    """The rows of ``select`` (PostgreSQL, a ``... FOR UPDATE``) locked by another
    transaction until the block ends."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            conn.execute(text(select), params)
            try:
                yield
            finally:
                conn.rollback()
    finally:
        engine.dispose()


def wait_for(condition: Callable[[], bool], timeout: float = 30) -> bool:
    """Whether ``condition`` came true within ``timeout`` seconds (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
