"""What the service lets in from the network, checked before any route runs.

- **Host.** Only expected names are served: IP addresses, ``localhost`` and the names in
  ``allowed_hosts``. A web page that points a name of its own at the service's address
  (DNS rebinding) sends that name as ``Host`` and is refused (400 ``host_not_allowed``),
  so it cannot read answers. An IP address involves no DNS, so it is always served.
- **Origin.** A browser request from a page of another origin is refused (403
  ``cross_origin``) unless that origin is in ``cors_origins``: without this a web page
  could open batches, abandon them, expire tables and take leases through the "simple"
  requests a browser sends without asking first. Browsers name the page's origin in
  ``Origin`` (on every request but a plain GET) and say how it relates in
  ``Sec-Fetch-Site``; the CLI, Spark and other programs send neither. Following a link
  to the console (a top-level navigation) stays allowed.
- **Content type.** A body sent to the API must be JSON (``application/json``, as the
  client, the CLI, Spark and openlineage-python send it): a form or text/plain body,
  which a page may send cross-site unasked, is refused (415 ``unsupported_media_type``).
- **Characters.** NUL, which PostgreSQL text cannot hold, and unpaired UTF-16
  surrogates (``"\\ud800"``), which no UTF-8 text can, are refused in the path, the query
  and JSON bodies (422 ``invalid_character``), for every route at once.

CORS stays off unless ``cors_origins`` names origins; then Starlette's CORS middleware
answers for those alone (see :func:`install_site_checks`).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from metaservice.settings import Settings

LOOPBACK_NAMES = frozenset({"localhost"})
# Methods a top-level navigation (following a link, typing the URL) uses.
NAVIGATION_METHODS = frozenset({"GET", "HEAD"})
# Sec-Fetch-Site values of a request made by a page of another origin.
OTHER_SITE = frozenset({"cross-site", "same-site"})
DEFAULT_PORTS = {"http": 80, "https": 443}


def install_site_checks(app: Starlette, settings: Settings) -> None:
    """Host and Origin checks as ``app``'s next outer middleware, with CORS inside them
    when ``cors_origins`` names origins (a refused origin gets no CORS headers)."""
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=[o.rstrip("/") for o in settings.cors_origins],
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["X-Request-ID", "Retry-After"],
        )
    app.add_middleware(SameSite, settings=settings)


def refusal(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, "field": field}, status_code=status)


# -- Host and Origin ------------------------------------------------------------------------


class SameSite:
    """Refuses requests naming an unexpected Host, or coming from another site's page."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.hosts = HostNames(settings.allowed_hosts)
        self.origins = frozenset(o.rstrip("/").lower() for o in settings.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not self.hosts.allows(host):
            response = refusal(
                400,
                "host_not_allowed",
                f"this service does not answer to the Host {host!r}: call it by an IP address "
                "or localhost, or add the name to allowed_hosts (METASERVICE_ALLOWED_HOSTS, "
                'a JSON list, e.g. ["metaservice.example.com"])',
                "Host",
            )
        elif (other := self._other_origin(scope["method"], headers, host)) is not None:
            response = refusal(
                403,
                "cross_origin",
                f"a browser request from {other} is refused: only pages of this service's "
                "own origin may call it. To let a web application call the API, add its "
                'origin to cors_origins (METASERVICE_CORS_ORIGINS, e.g. ["https://app.example.com"])',
                "Origin",
            )
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)

    def _other_origin(self, method: str, headers: Headers, host: str) -> str | None:
        """The origin (or Sec-Fetch-Site relation) of a request from a page of another
        origin, not allowed by ``cors_origins``; None for any other request."""
        origin = headers.get("origin")
        if origin is not None:
            if origin.rstrip("/").lower() in self.origins or same_origin(origin, host):
                return None
            return f"the origin {origin!r}"
        site = headers.get("sec-fetch-site", "").lower()
        if site not in OTHER_SITE:
            return None
        if method in NAVIGATION_METHODS and headers.get("sec-fetch-mode") == "navigate":
            return None  # a link to the console followed from another site's page
        return f"a {site} page"


class HostNames:
    """The ``Host`` names served: any IP address, ``localhost``, and the configured names
    (``*.example.com``: any name under example.com; ``*``: every name).

    >>> HostNames(["ms.example.com"]).allows("ms.example.com:8765"), HostNames([]).allows("evil.example")
    (True, False)
    """

    def __init__(self, configured: Iterable[str]) -> None:
        names = {name.strip().lower().rstrip(".") for name in configured}
        self.any = "*" in names
        self.exact = LOOPBACK_NAMES | {n for n in names if not n.startswith("*")}
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))

    def allows(self, host_header: str) -> bool:
        if self.any or not host_header:
            return True  # no Host at all (an HTTP/1.0 probe): no browser sends that
        name, _ = split_host(host_header)
        if not name:
            return False
        if is_ip_address(name):
            return True
        return name in self.exact or (bool(self.suffixes) and name.endswith(self.suffixes))


def split_host(host_header: str) -> tuple[str, int | None]:
    """``("name", port)`` of a Host header (``[::1]:8765`` gives ``("::1", 8765)``),
    the name lower case without a trailing dot; ``("", None)`` when it is unreadable."""
    try:
        parts = urlsplit("//" + host_header.strip())
        return (parts.hostname or "").rstrip("."), parts.port
    except ValueError:  # a port that is no number, an unclosed bracket
        return "", None


def is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def same_origin(origin: str, host_header: str) -> bool:
    """Whether the page's ``Origin`` is the service itself as the request names it.

    >>> same_origin("http://127.0.0.1:8765", "127.0.0.1:8765"), same_origin("https://ms.example", "ms.example")
    (True, True)
    >>> same_origin("http://evil.example", "127.0.0.1:8765"), same_origin("null", "127.0.0.1:8765")
    (False, False)
    """
    try:
        parts = urlsplit(origin.strip())
        origin_port = parts.port
    except ValueError:
        return False
    default = DEFAULT_PORTS.get(parts.scheme.lower())
    if default is None or not parts.hostname:
        return False  # "null" (a sandboxed frame, a file), or no web origin at all
    name, port = split_host(host_header)
    return parts.hostname.rstrip(".") == name and (origin_port or default) == (port or default)


# -- the body's type and characters ---------------------------------------------------------


class CleanInput:
    """Refuses a non-JSON body to the API, and NUL or unpaired surrogates in the path, the
    query or a JSON body. Runs inside the body limit, so the body is already bounded.

    A route in ``own_body_check`` checks its body's characters itself, with
    :func:`bad_string` (the OpenLineage ingest: its body may be gzip, and it answers
    a bad event in its own form)."""

    def __init__(self, app: ASGIApp, api_prefix: str, own_body_check: Iterable[str] = ()) -> None:
        self.app = app
        self.api_prefix = api_prefix + "/"
        self.own_body_check = frozenset(own_body_check)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        response = self._refuse_path_or_query(scope)
        if response is None and scope["path"].startswith(self.api_prefix) and has_body(headers):
            response = self._refuse_media_type(headers)
            if response is None:
                buffered = [message := await receive()]
                while message["type"] == "http.request" and message.get("more_body", False):
                    buffered.append(message := await receive())
                if _identity(headers) and scope["path"] not in self.own_body_check:
                    response = refuse_body(b"".join(m.get("body", b"") for m in buffered))
                receive = _replay(buffered, receive)
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _refuse_path_or_query(scope: Scope) -> JSONResponse | None:
        if "\x00" in scope["path"]:
            return refuse_text("a NUL character", "path")
        query: bytes = scope.get("query_string", b"")
        if b"%00" in query or b"\x00" in query:
            return refuse_text("a NUL character", _nul_parameter(query))
        return None

    @staticmethod
    def _refuse_media_type(headers: Headers) -> JSONResponse | None:
        media_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type == "application/json" or (
            media_type.startswith("application/") and media_type.endswith("+json")
        ):
            return None
        return refusal(
            415,
            "unsupported_media_type",
            f"the body is sent as {media_type or 'no content type'!r}; the API takes JSON "
            "only: send it with 'Content-Type: application/json'",
            "Content-Type",
        )


def has_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "transfer-encoding" in headers


def _identity(headers: Headers) -> bool:
    return headers.get("content-encoding", "identity").strip().lower() == "identity"


def _replay(buffered: list[Message], receive: Receive) -> Receive:
    async def replay() -> Message:
        return buffered.pop(0) if buffered else await receive()

    return replay


def _nul_parameter(query: bytes) -> str:
    """The name of the first query parameter whose name or value holds a NUL."""
    for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if "\x00" in name or "\x00" in value:
            return name.replace("\x00", "") or "query"
    return "query"


def refuse_body(body: bytes) -> JSONResponse | None:
    """422 for a JSON body holding a NUL or an unpaired surrogate, naming the field."""
    problem = bad_character(body)
    if problem is None:
        return None
    found = bad_string(body)
    where = ".".join(str(part) for part in found[0]) if found and found[0] else "body"
    return refuse_text(problem, where)


def refuse_text(problem: str | None, field: str) -> JSONResponse | None:
    """422 ``invalid_character`` for ``problem`` in ``field``; None when there is none."""
    if problem is None:
        return None
    return refusal(
        422,
        "invalid_character",
        f"{field} holds {problem}, which the service does not store: remove it",
        field,
    )


# A JSON escape \uXXXX with the backslashes before it: an odd run is an escape, an even
# one is escaped backslashes followed by the text "uXXXX".
_ESCAPE = re.compile(rb"(\\+)u([0-9a-fA-F]{4})")
UNPAIRED = "an unpaired UTF-16 surrogate (\\ud800-\\udfff not in a pair)"


def bad_character(body: bytes) -> str | None:
    """What in the JSON text ``body`` cannot be stored: a NUL (raw or ``\\u0000``) or an
    unpaired surrogate escape; None when it has neither. One linear scan, and none at all
    for a body without escapes.

    >>> bad_character(rb'{"a": "x\\u0000"}'), bad_character(rb'{"a": "\\\\u0000"}')
    ('a NUL character', None)
    >>> bad_character(rb'"\\ud83d\\ude00"'), bad_character(rb'"\\ud83d"') is not None
    (None, True)
    """
    if b"\x00" in body:
        return "a NUL character"
    if b"\\u" not in body:
        return None
    awaiting_low_at: int | None = None  # where a high surrogate's low half must begin
    for escape in _ESCAPE.finditer(body):
        backslashes = len(escape.group(1))
        if backslashes % 2 == 0:
            continue
        start = escape.start() + backslashes - 1  # the escape's own backslash
        code = int(escape.group(2), 16)
        if awaiting_low_at is not None:
            if start != awaiting_low_at or not 0xDC00 <= code <= 0xDFFF:
                return UNPAIRED
            awaiting_low_at = None
        elif code == 0:
            return "a NUL character"
        elif 0xD800 <= code <= 0xDBFF:
            awaiting_low_at = escape.end()
        elif 0xDC00 <= code <= 0xDFFF:
            return UNPAIRED
    return UNPAIRED if awaiting_low_at is not None else None


def bad_string(body: bytes) -> tuple[tuple[str | int, ...], str] | None:
    """Where in the JSON text ``body`` a key or string holds a NUL or an unpaired surrogate
    (the path to it, and the problem); None when nowhere, or when ``body`` is not JSON.

    >>> bad_string(rb'{"job": {"name": "a\\u0000"}}'), bad_string(rb'[1, "\\udc00"]')[0]
    ((('job', 'name'), 'a NUL character'), (1,))
    """
    if bad_character(body) is None:
        return None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return _find_bad(doc, ())


def _find_bad(value: Any, path: tuple[str | int, ...]) -> tuple[tuple[str | int, ...], str] | None:
    pending: list[tuple[Any, tuple[str | int, ...]]] = [(value, path)]
    while pending:  # depth first, without recursion: the body may be deep
        item, where = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return where, "a NUL character"
            if _LONE_SURROGATE.search(item):
                return where, UNPAIRED
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                if "\x00" in key or _LONE_SURROGATE.search(key):
                    return (*where, key), "a NUL character" if "\x00" in key else UNPAIRED
                pending.append((child, (*where, key)))
        elif isinstance(item, list):
            pending.extend((child, (*where, i)) for i, child in reversed(list(enumerate(item))))
    return None


# json.loads keeps an escaped pair as one character: a surrogate left in a str is unpaired.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
