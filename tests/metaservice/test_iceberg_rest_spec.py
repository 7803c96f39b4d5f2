"""Every answer of /iceberg validates against the Iceberg REST spec's own schemas
(``specs/rest-catalog-open-api.yaml``): the config, namespaces, tables, a loaded table
(with data, and empty), and each kind of error."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from tests.metaservice import test_iceberg_rest
from tests.metaservice.test_iceberg_rest import Pipeline, run

served = test_iceberg_rest.served
jobs_catalog = test_iceberg_rest.jobs_catalog
pipeline = test_iceberg_rest.pipeline

SPEC = Path(__file__).parent / "specs" / "rest-catalog-open-api.yaml"


def _json_schema(node: Any) -> Any:
    """OpenAPI 3.0's ``nullable: true`` as JSON Schema's ``type: [..., "null"]``."""
    if isinstance(node, list):
        return [_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        if "type" in out:
            out["type"] = [out["type"], "null"]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


@cache
def _spec() -> dict[str, Any]:
    return _json_schema(yaml.safe_load(SPEC.read_text()))  # type: ignore[no-any-return]


def check(body: Any, schema: str) -> None:
    spec = _spec()
    registry = Registry().with_resource("spec", Resource.opaque(spec))
    ref = {"$ref": f"spec#/components/schemas/{schema}"}
    errors = list(Draft202012Validator(ref, registry=registry).iter_errors(body))
    assert not errors, (schema, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]])


def get(http: httpx.Client, path: str, status: int = 200, **params: Any) -> Any:
    r = http.get(path, params=params)
    assert r.status_code == status, r.text
    return r.json()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_every_answer_validates_against_the_spec(pipeline: Pipeline) -> None:
    from tests.metaservice.helpers import put_job

    put_job(pipeline.http, "other", ["ods.empty"])
    pipeline.lake.table("ods.empty")
    run(pipeline, 2)
    http = pipeline.http
    config = get(http, "/iceberg/v1/config")
    check(config, "CatalogConfig")
    base = f"/iceberg/v1/{config['overrides']['prefix']}"
    check(get(http, f"{base}/namespaces"), "ListNamespacesResponse")
    check(get(http, f"{base}/namespaces", parent="ods"), "ListNamespacesResponse")
    check(get(http, f"{base}/namespaces/ods"), "GetNamespaceResponse")
    check(get(http, f"{base}/namespaces/ods/tables"), "ListTablesResponse")
    for table in ("orders", "empty"):
        for mode in ("all", "refs"):
            loaded = get(http, f"{base}/namespaces/ods/tables/{table}", snapshots=mode)
            check(loaded, "LoadTableResult")
    errors = [
        get(http, "/iceberg/v1/config", 400, warehouse="nowhere"),
        get(http, f"{base}/namespaces/nope", 404),
        get(http, f"{base}/namespaces/ods/tables/nope", 404),
        get(http, f"{base}/namespaces/ods/views", 406),
        get(http, f"{base}/namespaces/ods/tables/orders", 400, snapshots="some"),
        get(http, "/iceberg/v1/no-such-session/namespaces", 400),
    ]
    for error in errors:
        check(error, "IcebergErrorResponse")
