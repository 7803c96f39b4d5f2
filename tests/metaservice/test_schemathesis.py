"""Schemathesis against the service's own OpenAPI document, in-process (ASGI).

Every operation of ``/openapi.json`` is fuzzed (positive and negative data) on a seeded
topology, on SQLite and PostgreSQL, with auth off and with auth on (as an admin token,
which every operation takes). A response must never be a 5xx and must match the
document: its status code, content type and body schema.
"""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.settings import Settings
from tests.metaservice.helpers import API, SLOT, put_job, report, run_batch, source_and_derived

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 20
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def seed(client: TestClient, clock: ManualClock) -> dict[str, Any]:
    """A small topology with data behind every read: two sources, a derived job, a sink
    job, committed batches, a lease and a token.

    Returns the known names per parameter: positive cases for an operation taking such a
    parameter are also drawn with it fixed to a seeded value, so that the answers with
    data (200 with a body, 409, 204) are reached and checked, not only 404s.
    """
    source_and_derived(client, clock)  # src -> ods.orders -> der -> dw.detail
    put_job(client, "items", ["ods.items"])
    put_job(client, "agg", ["dws.revenue"], inputs=["dw.detail", "ods.items"])
    run_batch(client, "items", 0, {"ods.items": 301})
    clock.advance(SLOT)
    src2 = run_batch(client, "src", 2, {"ods.orders": 103})
    run_batch(client, "der", 1, {"dw.detail": 202})
    run_batch(client, "agg", 0, {"dws.revenue": 401})
    clock.advance(SLOT)
    r = client.post(f"{API}/leases", json={"tables": ["dw.detail"], "lease_seconds": 60})
    assert r.status_code == 201, r.text
    lease_id = r.json()["lease_id"]
    r = client.post(f"{API}/tokens", json={"role": "reader", "description": "seeded"})
    assert r.status_code == 201, r.text
    token_id = r.json()["id"]
    snapshots = [("ods.orders", 101), ("ods.orders", 103), ("dw.detail", 201), ("dws.revenue", 401)]
    tables = ["ods.orders", "dw.detail", "ods.items", "dws.revenue"]
    duplicate = report("src", 2, src2, "ods.orders", 103)
    return {
        # whole bodies, for operations whose generated bodies never name a known table
        "body": {
            "PUT /api/v1/jobs/{job}": [
                {"outputs": ["ods.fuzzed"]},
                {"inputs": ["ods.orders"], "outputs": ["dw.fuzzed"]},
                {"outputs": ["ods.orders"]},  # 409 second_writer unless the job is src
            ],
            "POST /api/v1/commits": [duplicate, {**duplicate, "snapshot_id": 999}],
            "POST /api/v1/commits/batch": [{"commits": [duplicate]}],
            "POST /api/v1/leases": [{"tables": ["ods.orders", "dw.detail"], "lease_seconds": 60}],
        },
        "path": [{"job": job} for job in ("src", "der", "items", "agg")]
        + [{"table": table, "snapshot_id": snapshot} for table, snapshot in snapshots]
        + [{"lease_id": lease_id}, {"token_id": token_id}],
        "query": [{"table": table} for table in tables]
        + [{"tables": "ods.orders,dw.detail"}, {"tables": "dws.revenue,ods.items,dw.detail"}],
    }


def operations(schema: schemathesis.BaseSchema) -> list[schemathesis.APIOperation]:
    """Every operation of the document; a part Schemathesis cannot read is an error.

    DELETEs come last: they remove seeded jobs, leases and tokens the others read.
    """
    ops = [result.ok() for result in schema.get_all_operations()]  # ok() raises if unreadable
    return sorted(ops, key=lambda op: op.method.upper() == "DELETE")


def has_inputs(operation: schemathesis.APIOperation) -> bool:
    """Whether the operation takes any parameter or body (/healthz and /readyz take none)."""
    sets = (operation.path_parameters, operation.query, operation.headers, operation.cookies)
    return any(any(True for _ in params) for params in (*sets, operation.body))


def strategy(
    operation: schemathesis.APIOperation,
    mode: schemathesis.GenerationMode,
    known: dict[str, Any],
) -> st.SearchStrategy[schemathesis.Case]:
    """Cases for the operation; positive ones also with seeded names in its parameters."""
    generated = operation.as_strategy(generation_mode=mode)
    if mode is not schemathesis.GenerationMode.POSITIVE:
        return generated
    seeded = []
    for location, params in (("path", operation.path_parameters), ("query", operation.query)):
        names = {p.name for p in params}
        for values in known[location]:
            fixed = {k: v for k, v in values.items() if k in names}
            if fixed:  # the other parameters and the body are still generated
                seeded.append(
                    operation.as_strategy(
                        generation_mode=mode,
                        **{"path_parameters" if location == "path" else "query": fixed},
                    )
                )
    for body in known["body"].get(operation.label, []):
        seeded.append(operation.as_strategy(generation_mode=mode, body=body))
    return st.one_of(generated, *seeded)


def fuzz(
    operation: schemathesis.APIOperation,
    cases: st.SearchStrategy[schemathesis.Case],
    headers: dict[str, str],
) -> None:
    """Up to MAX_EXAMPLES generated requests to one operation, every response checked."""

    @given(case=cases)
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,  # the same requests on every run; a failure reproduces
        database=None,
        # Every example talks to the one seeded app; a slow strategy is no bug of the service.
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(checks=CHECKS, headers=headers)

    run()


# Who calls: auth off (every caller is admin), or auth on with an admin token, or with a
# writer token scoped to one job (``der``): its refusals (403 out_of_scope) and its own
# job's answers must conform too.
CALLERS = ["auth off", "admin token", "scoped writer"]
# What each token is made as, for the callers that bring one.
TOKENS = {"admin token": {"role": "admin"}, "scoped writer": {"role": "writer", "jobs": ["der"]}}


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode))
def test_every_operation_conforms_to_the_openapi_document(
    db_url: str, clock: ManualClock, mode: schemathesis.GenerationMode, caller: str
) -> None:
    """The app is built per test (per database kind and generation mode) rather than in a
    fixture the Hypothesis test would take, so no function-scoped fixture is shared across
    examples. The seeding client runs and ends its own lifespan; Schemathesis then starts
    the app's lifespan itself, and its pytest plugin ends it at teardown.

    (``schemathesis.pytest.from_fixture`` would be the idiomatic form, but it sets
    ``Function._nodeid``, which pytest 9.2 no longer has.)
    """
    if caller == "scoped writer" and (
        mode is schemathesis.GenerationMode.NEGATIVE or not db_url.startswith("sqlite")
    ):
        # Each case takes minutes: the scoped writer runs once, positive, on SQLite (the
        # scope is decided before any query, so the database adds nothing to it).
        pytest.skip("the scoped writer's case runs in positive mode on SQLite only")
    app = create_app(Settings(db_url=db_url), clock)
    with TestClient(app, raise_server_exceptions=False) as client:
        known = seed(client, clock)
        headers: dict[str, str] = {}
        if caller in TOKENS:
            r = client.post(f"{API}/tokens", json={**TOKENS[caller], "description": "fuzzing"})
            assert r.status_code == 201, r.text
            headers = {"Authorization": f"Bearer {r.json()['token']}"}
    if headers:  # the same seeded database, now with auth required
        app = create_app(Settings(db_url=db_url, auth_required=True), clock)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures = []
    for operation in operations(schema):
        if mode is schemathesis.GenerationMode.NEGATIVE and not has_inputs(operation):
            continue  # nothing to make invalid: Hypothesis would find no example at all
        try:
            fuzz(operation, strategy(operation, mode, known), headers)
        # Collect every operation's failure, then report them all. Schemathesis raises its
        # check failures as a FailureGroup, a BaseExceptionGroup.
        except (Exception, BaseExceptionGroup) as exc:
            # The whole exception, a group's members included: Hypothesis reports a
            # failure that did not repeat as a FlakyFailure whose message alone does not
            # say which request failed, or how.
            detail = "".join(traceback.format_exception(exc))
            failures.append(f"{operation.label} ({mode.value}):\n{detail}")
    assert not failures, f"{len(failures)} operations failed:\n\n" + "\n\n".join(failures)
