"""The shortest path through the service: register, barrier, commit, consistent version."""

from __future__ import annotations


def test_source_commit_becomes_consistent_after_its_slot_closes(client, clock):
    assert client.put("/api/v1/jobs/src", json={"outputs": ["ods.orders"]}).status_code == 201
    barrier = client.post("/api/v1/jobs/src/batches/0/barrier").json()["barrier"]
    report = {
        "job": "src",
        "batch_id": 0,
        "barrier": barrier,
        "table": "ods.orders",
        "snapshot_id": 7,
    }
    assert client.post("/api/v1/commits", json=report).json()["status"] == "recorded"
    clock.advance(1000)
    version = client.get("/api/v1/versions/consistent", params={"tables": "ods.orders"}).json()
    assert version == {"barrier": barrier, "snapshots": {"ods.orders": 7}}
