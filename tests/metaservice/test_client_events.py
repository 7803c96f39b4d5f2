"""The client's listener events: ``send_job_event`` asks for no view back, ``job_event``
still answers it (``httpx.MockTransport``, no server)."""

from __future__ import annotations

import json

import httpx

from metaservice.client import MetaServiceClient
from metaservice.topology.schemas import JobEvent

VIEW = {
    "name": "src",
    "description": "",
    "kind": "source",
    "inputs": [],
    "outputs": ["ods.orders"],
    "status": "running",
    "frontier": 0,
    "last_barrier": None,
    "last_batch_id": None,
    "pending_target": None,
    "last_seen_ms": 1,
    "offline_floor": None,
}
EVENT = JobEvent(event="progress", run_id="r1", batch_id=3, num_input_rows=10)


def _client(answer: httpx.Response, seen: list[httpx.Request]) -> MetaServiceClient:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer

    return MetaServiceClient("http://ms", transport=httpx.MockTransport(handle))


def test_send_job_event_prefers_return_minimal_and_answers_nothing():
    seen: list[httpx.Request] = []
    with _client(httpx.Response(204), seen) as ms:
        assert ms.send_job_event("src", EVENT) is None
    (request,) = seen
    assert (request.method, request.url.path) == ("POST", "/api/v1/jobs/src/events")
    assert request.headers["prefer"] == "return=minimal"
    assert json.loads(request.content) == {
        "event": "progress",
        "run_id": "r1",
        "batch_id": 3,
        "num_input_rows": 10,
    }


def test_send_job_event_to_a_service_that_ignores_the_preference_drops_the_view():
    seen: list[httpx.Request] = []
    with _client(httpx.Response(200, json=VIEW), seen) as ms:
        assert ms.send_job_event("src", EVENT) is None


def test_job_event_still_asks_for_and_answers_the_view():
    seen: list[httpx.Request] = []
    with _client(httpx.Response(200, json=VIEW), seen) as ms:
        assert ms.job_event("src", EVENT).status == "running"
    assert "prefer" not in seen[0].headers
