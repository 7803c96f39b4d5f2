"""The service's logs: one format for its own lines and uvicorn's, text or JSON lines.

``metaservice start --log-format json`` (``METASERVICE_LOG_FORMAT``, ``log_format`` in the
config file) writes one JSON object per line::

    {"time": "2026-05-01T12:00:00.123Z", "level": "INFO", "logger": "uvicorn.access",
     "message": "127.0.0.1:50312 - \\"GET /api/v1/tables HTTP/1.1\\" 200",
     "request_id": "5f0c...", "client": "127.0.0.1:50312", "method": "GET",
     "path": "/api/v1/tables", "status": 200}

with the fields a line carries: the request id of the request it was logged in (also
sent back in the ``X-Request-ID`` header, or taken from the request's own header), the
access log's client, method, path and status, anything passed with ``extra={...}``, and
the exception's traceback. ``text`` is the same lines for people, request id included.
Every worker of ``--workers N`` configures itself from :func:`log_config`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

FORMATS = ("text", "json")
REQUEST_ID_HEADER = "X-Request-ID"
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "metaservice_request_id", default=None
)
# A caller's own id is kept when it is short and plain; anything else gets a fresh one.
_GOOD_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Attributes every LogRecord has: the rest were passed with extra={...}.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's colored copy of the message
    "request_id",
}


class RequestId:
    """ASGI middleware: a request id per HTTP request, in the logs and the response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers", [])).get(REQUEST_ID_HEADER.lower().encode(), b"")
        text = given.decode("latin-1")
        rid = text if _GOOD_ID.fullmatch(text) else uuid.uuid4().hex
        token = request_id.set(rid)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID_HEADER.lower().encode(), rid.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)


class RequestIdFilter(logging.Filter):
    """Puts the current request id on each record (``-`` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line; see the module docstring for the fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            )[:-6]
            + "Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid and rid != "-":
            line["request_id"] = rid
        if record.name == "uvicorn.access" and isinstance(record.args, tuple):
            line.update(_access_fields(record.args))
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in line:
                line[key] = value if _is_json(value) else repr(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)


def _access_fields(args: tuple[Any, ...]) -> dict[str, Any]:
    """uvicorn's access line is ``'%s - "%s %s HTTP/%s" %d'`` of these five."""
    if len(args) != 5:
        return {}
    client, method, path, http_version, status = args
    return {
        "client": client,
        "method": method,
        "path": path,
        "http_version": http_version,
        "status": status,
    }


def _is_json(value: Any) -> bool:
    return isinstance(value, str | int | float | bool | type(None) | list | dict)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def redact_url(url: str) -> str:
    """``url`` with the password of its user part (or a lone token there) replaced, for
    logs and terminals: ``http://u:secret@marquez:5000`` gives ``http://u:***@marquez:5000``.

    >>> redact_url("postgresql+psycopg://svc:S3cret@db/ms"), redact_url("http://tok@h:1/x")
    ('postgresql+psycopg://svc:***@db/ms', 'http://***@h:1/x')
    >>> redact_url("http://marquez:5000")
    'http://marquez:5000'
    """
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not sep or not at:
        return url
    user, colon, _ = userinfo.partition(":")
    hidden = f"{user}:***" if colon else "***"
    return f"{scheme}://{hidden}@{host}{slash}{path}"


def log_config(level: str = "info", fmt: str = "text") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` for the service and uvicorn (its ``log_config``):
    every logger, access log included, through one handler on stderr in ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: give one of {', '.join(FORMATS)}")
    formatter: dict[str, Any] = {"()": JsonFormatter} if fmt == "json" else {"format": TEXT_FORMAT}
    handler = {
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
        "formatter": "default",
        "filters": ["request_id"],
    }
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}},
        "formatters": {"default": formatter},
        "handlers": {"default": handler},
        "root": {"handlers": ["default"], "level": level},
        "loggers": {
            # uvicorn's own handlers are replaced: its lines go through the root's
            "uvicorn": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.error": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.access": {"handlers": [], "level": level, "propagate": True},
        },
    }
