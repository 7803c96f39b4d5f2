"""What an error answer of the MetaService or its log service says, read client-side.

Both answer 4xx/5xx with a JSON body ``{"code", "message", "field", ...}``; a proxy or a
crash may answer something else. The service's client (``metaservice.client_errors``)
and the log store's (``metaservice.logstore.client``) each map the parts to their own
exception classes. Imports nothing of either, so an executor's log writer loads neither
the service's schemas nor its client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class ErrorBody:
    status: int
    code: str
    message: str
    field: Any
    body: dict[str, Any]


def error_body(response: httpx.Response) -> ErrorBody:
    """The parts of an error answer: its JSON object's where it has one, else the HTTP
    status's (code ``http_error``, the start of the text as the message)."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    return ErrorBody(
        response.status_code,
        str(body.get("code", "http_error")),
        str(body.get("message", response.text[:300] or response.reason_phrase)),
        body.get("field"),
        body,
    )
