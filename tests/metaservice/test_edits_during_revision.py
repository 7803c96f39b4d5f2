"""Topology edits while a revision runs (DESIGN.md, Revision): the affected set is the
downstream closure at the swap, so a reader or an output added during the revision
would be left on the replaced table. Such an edit is refused (409
``revision_running``, nothing changed) until the revision is swapped or cancelled;
edits outside the affected set go on as ever.

The lake and fixtures are test_revisions' (real Iceberg tables through pyiceberg).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyiceberg")

from fastapi.testclient import TestClient

from tests.metaservice import test_revisions
from tests.metaservice.helpers import API, assert_error, put_job, unchanged
from tests.metaservice.test_expiry import Lake
from tests.metaservice.test_revisions import created, pipeline

warehouse = test_revisions.warehouse
settings = test_revisions.settings
catalog = test_revisions.catalog
lake = test_revisions.lake

# dw.detail is revised: its closure is dw.detail (der) and dws.summary (agg).
REFUSED: list[tuple[str, str, str, dict[str, Any] | None, str]] = [
    (
        "a new reader of the revised table",
        "PUT",
        "/jobs/report",
        {"inputs": ["dw.detail"], "outputs": ["dws.report"]},
        "inputs",
    ),
    (
        "a new reader of a table downstream of it",
        "PUT",
        "/jobs/report",
        {"inputs": ["dws.summary"], "outputs": ["dws.report"]},
        "inputs",
    ),
    (
        "a job registered before starting to read it",
        "PUT",
        "/jobs/late",
        {"inputs": ["dw.detail"], "outputs": ["dws.late"]},
        "inputs",
    ),
    (
        "an output added to an affected writer",
        "PUT",
        "/jobs/der",
        {"inputs": ["ods.orders"], "outputs": ["dw.detail", "dw.extra"]},
        "outputs",
    ),
    (
        "an output removed from an affected writer",
        "PUT",
        "/jobs/agg",
        {"inputs": ["dw.detail", "ods.items"], "outputs": ["dws.summary_v2"]},
        "outputs",
    ),
    ("deleting an affected writer", "DELETE", "/jobs/agg", None, "job"),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [r[1:] for r in REFUSED],
    ids=[r[0] for r in REFUSED],
)
def test_an_edit_into_the_affected_set_is_refused_while_the_revision_runs(
    client: TestClient,
    lake: Lake,
    db_url: str,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    field: str,
) -> None:
    _, version = pipeline(client, lake)
    put_job(client, "late", ["dws.late"])  # a source that has not run: it may become a reader
    revision = created(client, "dw.detail", version["barrier"])["id"]
    with unchanged(db_url):
        refused = assert_error(
            client.request(method, f"{API}{path}", json=body), 409, "revision_running", field
        )
    message = refused["message"]
    assert f"revision {revision}" in message, message
    assert f"POST /api/v1/revisions/{revision}/swap" in message, message
    assert f"DELETE /api/v1/revisions/{revision}" in message, message
    assert "Nothing was changed" in message, message
    # once the revision is cancelled, the same edit is made
    assert client.delete(f"{API}/revisions/{revision}").status_code == 200
    r = client.request(method, f"{API}{path}", json=body)
    assert r.status_code in (200, 201, 204), r.text


def test_edits_outside_the_affected_set_go_on_while_a_revision_runs(
    client: TestClient, lake: Lake
) -> None:
    _, version = pipeline(client, lake)
    created(client, "dw.detail", version["barrier"])
    # ods.orders is upstream of dw.detail, ods.items unaffected: new readers are fine
    view = put_job(client, "other", ["dws.other"], inputs=["ods.orders", "ods.items"])
    assert view["inputs"] == ["ods.items", "ods.orders"]
    # and the affected jobs' drivers register again unchanged
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    put_job(client, "agg", ["dws.summary"], inputs=["dw.detail", "ods.items"])
