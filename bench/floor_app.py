"""The MetaService app with a few probe routes: the floors of SQL through its stack.

``bench_service --part cycles`` runs the service from this factory so that, in the
same run as the batch cycles, it can measure what SQL alone costs a request on the
service's own path (the same database turns, worker threads and connection pool):
no table, no logic, only round trips. Set beside ``/healthz`` they tell how far a
request with N statements can get at best. Not part of the service.

- ``GET /probe/one``: one ``SELECT 1`` outside a transaction (lineage's path);
- ``GET /probe/read4``: four ``SELECT 1`` in a read transaction (a Session);
- ``POST /probe/write6/{i}``: five ``SELECT 1`` and one ``UPDATE`` of row ``i`` of
  ``probe_rows`` in a write transaction, urgent (a barrier's or a report's shape);
- ``POST /probe/core6/{i}``: the same six statements on a SQLAlchemy Core connection
  (no Session), on a plain executor thread (the database's turns cost nothing measurable
  beside this: 3.34 against 3.31 ms of CPU a request, measured once);
- ``POST /probe/raw6/{i}``: the same six statements on a raw DB-API connection from
  the pool, without SQLAlchemy (the floor of this driver, this pool and one thread hop).

``probe_rows`` (``id``, ``v``) is created by :func:`create_probe_rows`.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request, Response
from sqlalchemy import text
from sqlalchemy.orm import Session

from metaservice.app import create_app as create_service
from metaservice.db import URGENT, make_engine
from metaservice.deps import services_of

# What ``uvicorn --factory`` runs to serve the app with the probes.
FACTORY = "bench.floor_app:create_app"
PROBE_ROWS = 16
_SELECT = text("SELECT 1")
_UPDATE = text("UPDATE probe_rows SET v = v + 1 WHERE id = :i")
_OK = b'{"ok":true}'


def create_probe_rows(url: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE probe_rows (id integer PRIMARY KEY, v bigint)"))
            rows = [{"id": i, "v": 0} for i in range(PROBE_ROWS)]
            conn.execute(text("INSERT INTO probe_rows (id, v) VALUES (:id, :v)"), rows)
    finally:
        engine.dispose()


def create_app() -> FastAPI:
    app = create_service()

    @app.get("/probe/one", include_in_schema=False)
    async def one(http: Request) -> Response:
        db = services_of(http).db
        await db.read_single_async(lambda conn: conn.execute(_SELECT).scalar())
        return Response(_OK, media_type="application/json")

    @app.get("/probe/read4", include_in_schema=False)
    async def read4(http: Request) -> Response:
        db = services_of(http).db
        await db.read_async(lambda session: [session.execute(_SELECT).scalar() for _ in range(4)])
        return Response(_OK, media_type="application/json")

    @app.post("/probe/write6/{i}", include_in_schema=False)
    async def write6(http: Request, i: int) -> Response:
        db = services_of(http).db

        def work(session: Session) -> None:
            for _ in range(5):
                session.execute(_SELECT).scalar()
            session.execute(_UPDATE, {"i": i})

        await db.write_async(work, URGENT)
        return Response(_OK, media_type="application/json")

    @app.post("/probe/core6/{i}", include_in_schema=False)
    async def core6(http: Request, i: int) -> Response:
        db = services_of(http).db

        def work() -> None:
            with db.engine.begin() as conn:
                for _ in range(5):
                    conn.execute(_SELECT).scalar()
                conn.execute(_UPDATE, {"i": i})

        await asyncio.get_running_loop().run_in_executor(None, work)
        return Response(_OK, media_type="application/json")

    @app.post("/probe/raw6/{i}", include_in_schema=False)
    async def raw6(http: Request, i: int) -> Response:
        db = services_of(http).db
        update = "UPDATE probe_rows SET v = v + 1 WHERE id = " + ("?" if db.sqlite else "%s")

        def work() -> None:
            conn = db.engine.raw_connection()
            try:
                cursor = conn.cursor()
                for _ in range(5):
                    cursor.execute("SELECT 1")
                    cursor.fetchone()
                cursor.execute(update, (i,))
                conn.commit()
            finally:
                conn.close()

        await asyncio.get_running_loop().run_in_executor(None, work)
        return Response(_OK, media_type="application/json")

    return app
