"""The log service's routes as an OpenAPI 3.1 document (served at ``/openapi.json``).

The log service is a small Starlette app, not FastAPI, so its document is written here,
beside the routes it describes (``server.create_log_app``); the request bodies' schemas
come from the same pydantic models the routes validate with. Tests fuzz the service
against it (``tests/metaservice/test_logstore_schemathesis.py``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from metaservice.logstore import wire

_TABLE = {
    "name": "table",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "maxLength": 400},
    "description": "namespace.name, e.g. dw.order_detail",
}
_ERROR = {
    "type": "object",
    "required": ["code", "message"],
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string"},
        "field": {"type": ["string", "null"]},
    },
}
_ERRORS = {
    "400": "A malformed request",
    "401": "Auth is on and the request brings no token the MetaService accepts",
    "403": "The token's role is too small, or a scoped writer's jobs do not write the table",
    "404": "The log holds nothing of the table",
    "409": "The log's epoch is not the caller's (log_reset), or it is full (log_full)",
    "410": "The position is older than what the log holds (log_gone)",
    "413": "The body is past a bound (as sent, or as its rows take once decoded)",
    "422": "The request breaks a rule (a bad table name, parameter or JSON body)",
}


def _int(name: str, minimum: int, required: bool = False, what: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "schema": {"type": "integer", "minimum": minimum, "maximum": 2**63 - 1},
        "description": what,
    }


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "required": True,
        "content": {"application/json": {"schema": model.model_json_schema()}},
    }


def _answers(ok: dict[str, Any], *errors: str) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": _ERROR}}}
    return {"200": ok, **{code: {"description": _ERRORS[code], **error} for code in errors}}


def _ok_json(schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": "Done",
        "content": {"application/json": {"schema": schema or {"type": "object"}}},
    }


def log_openapi(
    persisted: type[BaseModel], spilled: type[BaseModel], reset: type[BaseModel]
) -> dict[str, Any]:
    """The document; the models are the routes' own request bodies."""
    p = wire.API_PREFIX
    rows = {
        "description": "The rows as an Arrow IPC stream",
        "content": {wire.ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "MetaService log service",
            "version": "1",
            "description": "A table's newest rows between barrier commits (see the user "
            "guide's 'Log store'). With auth on every route but /healthz and /v1/identity "
            "needs a bearer token: writer to append, mark persisted, claim spilled, reset; "
            "reader to read and see status.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
        "paths": {
            f"{p}/tables/{{table}}/entries": {
                "post": {
                    "operationId": "append",
                    "summary": "Append a batch's rows at (barrier, batch)",
                    "parameters": [
                        _TABLE,
                        _int("barrier", 0, True, "The batch's barrier"),
                        _int("batch_id", 0, True, "The Spark batch id"),
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            wire.ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}}
                        },
                    },
                    "responses": _answers(_ok_json(), "400", "401", "403", "409", "413", "422"),
                },
                "get": {
                    "operationId": "read",
                    "summary": "Read rows after a position",
                    "parameters": [
                        _TABLE,
                        _int("after_seq", 0, what="Rows after this sequence number"),
                        _int("epoch", 0, what="The epoch the reader follows"),
                        _int("after_batch", -1, what="Rows of batches after this one"),
                        _int("max_bytes", 1, what="At most about this many bytes"),
                        {
                            "name": "job",
                            "in": "query",
                            "schema": {"type": "string", "maxLength": 200},
                        },
                        {
                            "name": "reader",
                            "in": "query",
                            "schema": {"type": "string", "maxLength": 200},
                        },
                    ],
                    "responses": _answers(rows, "400", "401", "403", "404", "409", "410", "422"),
                },
            },
            f"{p}/tables/{{table}}/persisted": {
                "post": {
                    "operationId": "persisted",
                    "summary": "Mark a batch committed to Iceberg as a snapshot",
                    "parameters": [_TABLE],
                    "requestBody": _json(persisted),
                    "responses": _answers(_ok_json(), "400", "401", "403", "409", "413", "422"),
                },
            },
            f"{p}/tables/{{table}}/spilled": {
                "post": {
                    "operationId": "spilled",
                    "summary": "Claim the files a batch's rows were spilled to",
                    "parameters": [_TABLE],
                    "requestBody": _json(spilled),
                    "responses": _answers(_ok_json(), "400", "401", "403", "409", "413", "422"),
                },
            },
            f"{p}/tables/{{table}}/reset": {
                "post": {
                    "operationId": "reset",
                    "summary": "Drop what the log holds past a committed batch",
                    "parameters": [
                        _TABLE,
                        {
                            "name": "job",
                            "in": "query",
                            "schema": {"type": "string", "maxLength": 200},
                        },
                    ],
                    "requestBody": _json(reset),
                    "responses": _answers(
                        _ok_json(), "400", "401", "403", "404", "409", "413", "422"
                    ),
                },
            },
            f"{p}/status": {
                "get": {
                    "operationId": "status",
                    "summary": "What the log holds of each table (or of one)",
                    "parameters": [
                        {
                            "name": "table",
                            "in": "query",
                            "schema": {"type": "string", "maxLength": 400},
                        }
                    ],
                    "responses": _answers(
                        _ok_json({"type": "object", "required": ["tables"]}),
                        "400",
                        "401",
                        "403",
                        "404",
                        "422",
                    ),
                },
            },
            f"{p}/identity": {
                "get": {
                    "operationId": "identity",
                    "summary": "Prove the log service holds a writer token (for the MetaService)",
                    "parameters": [
                        {
                            "name": "nonce",
                            "in": "query",
                            "required": True,
                            "schema": {
                                "type": "string",
                                "minLength": 16,
                                "maxLength": 200,
                                "pattern": "^[A-Za-z0-9]+$",
                            },
                        }
                    ],
                    "responses": _answers(_ok_json(), "400", "404", "422"),
                },
            },
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "summary": "Liveness",
                    "responses": {"200": _ok_json()},
                },
            },
        },
    }
