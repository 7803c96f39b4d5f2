"""A catalog session across a revision's swap: configured before, it reads all-old; after,
all-new (test_revision_swap's pipeline, on real Iceberg tables, SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyiceberg")

from fastapi.testclient import TestClient

from tests.metaservice import test_expiry
from tests.metaservice.test_expiry import Lake
from tests.metaservice.test_revision_swap import (  # noqa: F401 (fixtures)
    AFFECTED,
    catalog,
    catch_up,
    ready_revision,
    settings,
    snapshot_ids,
    swap,
    warehouse,
)

lake = test_expiry.lake


def session(client: TestClient) -> str:
    r = client.get("/iceberg/v1/config")
    assert r.status_code == 200, r.text
    return str(r.json()["overrides"]["prefix"])


def snapshots(client: TestClient, prefix: str) -> dict[str, Any]:
    """The snapshot each affected table reads in the session, by its name there."""
    read = {}
    for name in AFFECTED:
        namespace, table = name.split(".")
        r = client.get(f"/iceberg/v1/{prefix}/namespaces/{namespace}/tables/{table}")
        assert r.status_code == 200, r.text
        read[name] = r.json()["metadata"]["current-snapshot-id"]
    return read


def listed(client: TestClient, prefix: str) -> list[str]:
    names = []
    for ns in client.get(f"/iceberg/v1/{prefix}/namespaces").json()["namespaces"]:
        r = client.get(f"/iceberg/v1/{prefix}/namespaces/{ns[0]}/tables")
        names += [f"{ns[0]}.{t['name']}" for t in r.json()["identifiers"]]
    return sorted(names)


def test_a_session_configured_before_a_swap_reads_all_old_and_one_after_all_new(
    client: TestClient, lake: Lake
) -> None:
    _, rid, next_id = ready_revision(client, lake)
    catch_up(client, lake, rid, next_id)
    before = session(client)
    old = snapshots(client, before)
    for name in AFFECTED:
        assert old[name] in snapshot_ids(lake, name), name  # the originals
    assert not [n for n in listed(client, before) if "__" in n]  # no mirror is listed

    done = swap(client, rid, wait_seconds=10)
    assert done.status_code == 200 and done.json()["state"] == "swapped", done.text

    assert snapshots(client, before) == old  # all-old, under the names it started with
    after = session(client)
    new = snapshots(client, after)
    for name in AFFECTED:
        assert new[name] in snapshot_ids(lake, f"{name}__rev{rid}"), name  # the mirrors
    assert listed(client, after) == listed(client, before)  # the replaced tables are not
