"""The MetaService's calls to the log services its writers publish: the status it shows
(``GET /api/v1/tables/{table}/log``, which the console asks every few seconds) and the
check of an address when a writer publishes it.

An address is whatever a writer sent, so these calls are made with care:

- **Only to log services.** An address is a scheme, a host and a port (no path, query
  or credentials), and the MetaService calls fixed paths under it. With auth on, the
  service there must first prove it holds a writer token
  (:mod:`~metaservice.logstore.proof`: ``GET /v1/identity``); one that does not is not
  asked anything else, and is not asked again for ``UNVERIFIED_SECONDS``. An address in
  the allowlist (``METASERVICE_LOG_ADDRESS_ALLOWLIST``: hosts, or host:port) needs no
  proof; with an allowlist set, an address outside it is not called at all.
- **One deadline** for the whole probe of a table (every service at once), async: no
  request thread waits on a log service.
- **Bounded answers** (``MAX_ANSWER_BYTES``), and **no foreign body echoed**: what a
  failed call says is one of a few fixed sentences, the same whether nothing listens
  at the address or something that is not a log service does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from metaservice.logstore import proof, wire

__all__ = [
    "PROBE_DEADLINE_S",
    "LogProbe",
    "ProbeAnswer",
    "origin_of",
    "signed_credential",
]

T = TypeVar("T")

PROBE_DEADLINE_S = 2.0
MAX_ANSWER_BYTES = 256 * 1024
MAX_IDENTITY_BYTES = 4 * 1024
UNVERIFIED_SECONDS = 30.0
_UNVERIFIED_KEPT = 10_000

# (token_id, nonce, mac) -> the token's stored hash when the proof holds, else None.
Verify = Callable[[int, str, str], Awaitable[str | None]]


class _Refused(Exception):
    """A call the probe gives up on, with the sentence it reports."""


@dataclass(frozen=True)
class ProbeAnswer:
    address: str
    reachable: bool
    status: dict[str, Any] | None
    error: str | None


def origin_of(address: str) -> str | None:
    """``scheme://host:port`` of a log service's address; None when it has more (a path,
    a query, credentials) or less (no port) than that."""
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return None
    if parts.username or parts.password or parts.query or parts.fragment:
        return None
    if parts.path not in ("", "/"):
        return None
    return f"{parts.scheme}://{parts.netloc}"


def _no_service(address: str) -> str:
    return f"no log service answered at {address}"


class LogProbe:
    """Asks log services for a table's status. ``verify`` checks a log service's proof
    (None: auth is off, and no proof is asked); ``allowlist``: hosts or host:port whose
    services need no proof (when given, no other address is called)."""

    def __init__(
        self,
        *,
        verify: Verify | None,
        allowlist: Sequence[str] = (),
        deadline: float = PROBE_DEADLINE_S,
    ) -> None:
        self._verify = verify
        self._allowlist = {entry.strip().lower() for entry in allowlist if entry.strip()}
        self.deadline = deadline

    def allowed(self, origin: str) -> bool:
        parts = urlsplit(origin)
        host = (parts.hostname or "").lower()
        return host in self._allowlist or f"{host}:{parts.port}" in self._allowlist

    async def status(self, table: str, addresses: Sequence[str]) -> list[ProbeAnswer]:
        """Each service's status of ``table``, all asked at once within one deadline."""
        tasks = [asyncio.ensure_future(self._one(table, a)) for a in addresses]
        done = await _within(tasks, self.deadline)
        answers = []
        for address, task in zip(addresses, tasks, strict=True):
            if task in done and task.exception() is None:
                answers.append(task.result())
            else:  # past the deadline (or failed in a way the probe did not foresee)
                answers.append(ProbeAnswer(address, False, None, _no_service(address)))
        return answers

    async def publishable(self, addresses: Sequence[str]) -> str | None:
        """Why these addresses may not be published (None: they may): outside the
        allowlist, or (auth on) no log service there proves it holds a token."""
        tasks = [asyncio.ensure_future(self._check_publishable(a)) for a in addresses]
        done = await _within(tasks, self.deadline)
        for address, task in zip(addresses, tasks, strict=True):
            if task not in done or task.exception() is not None:
                return _unproven(address)
            if (why := task.result()) is not None:
                return why
        return None

    async def _check_publishable(self, address: str) -> str | None:
        origin = origin_of(address)
        if origin is None:
            return _not_an_origin(address)
        if self.allowed(origin):
            return None
        if self._allowlist:
            return f"{address} is not in the log address allowlist"
        if self._verify is None:
            return None  # auth is off: anyone may publish anything anyway
        async with _client() as client:
            try:  # a writer publishing: asked now, whatever the address answered lately
                await self._identity(client, origin, fresh=True)
            except _Refused:
                return _unproven(address)
        return None

    async def _one(self, table: str, address: str) -> ProbeAnswer:
        origin = origin_of(address)
        if origin is None:
            return ProbeAnswer(address, False, None, _not_an_origin(address))
        allowed = self.allowed(origin)
        if self._allowlist and not allowed:
            return ProbeAnswer(address, False, None, f"{address} is not in the allowlist")
        async with _client() as client:
            try:
                headers = {}
                if self._verify is not None:
                    key = await self._key(client, origin, required=not allowed)
                    if key is not None:
                        token_id, secret = key
                        credential = proof.sign(secret, token_id, proof.READ_STATUS, table)
                        headers["Authorization"] = f"Bearer {credential}"
                status, body = await _get(
                    client, f"{origin}{wire.API_PREFIX}/status", {"table": table}, headers
                )
            except _Refused as refused:
                return ProbeAnswer(address, False, None, str(refused))
        if status == 404 and isinstance(body, dict) and body.get("code") == wire.TABLE_UNKNOWN_CODE:
            return ProbeAnswer(
                address, True, None, f"the log service at {address} holds nothing of {table}"
            )
        found = body.get("tables") if status == 200 and isinstance(body, dict) else None
        if not isinstance(found, list) or not found or not isinstance(found[0], dict):
            return ProbeAnswer(address, True, None, f"{address} did not answer with a log status")
        return ProbeAnswer(address, True, found[0], None)

    async def _key(
        self, client: httpx.AsyncClient, origin: str, *, required: bool
    ) -> tuple[int, str] | None:
        """The proven token's (id, stored hash); None for an allowlisted service that
        proves nothing. _Refused when a proof is required and none holds."""
        try:
            return await self._identity(client, origin)
        except _Refused:
            if required:
                raise
            return None

    async def _identity(
        self, client: httpx.AsyncClient, origin: str, *, fresh: bool = False
    ) -> tuple[int, str]:
        until = _unverified.get(origin)
        if not fresh and until is not None and until > time.monotonic():
            raise _Refused(_unproven(origin))
        nonce = secrets.token_hex(16)
        try:
            status, body = await _get(
                client,
                f"{origin}{wire.API_PREFIX}/identity",
                {"nonce": nonce},
                {},
                limit=MAX_IDENTITY_BYTES,
            )
            if status != 200 or not isinstance(body, dict):
                raise _Refused(_unproven(origin))
            token_id, mac = body.get("token_id"), body.get("mac")
            if not isinstance(token_id, int) or not isinstance(mac, str) or len(mac) > 200:
                raise _Refused(_unproven(origin))
            assert self._verify is not None
            secret = await self._verify(token_id, nonce, mac)
            if secret is None:
                raise _Refused(_unproven(origin))
        except _Refused:
            _remember_unverified(origin)
            raise
        _unverified.pop(origin, None)
        return token_id, secret


async def _within(tasks: Sequence[asyncio.Task[T]], deadline: float) -> set[asyncio.Task[T]]:
    """The tasks done within ``deadline``; the others are cancelled (and awaited)."""
    if not tasks:
        return set()
    done, pending = await asyncio.wait(tasks, timeout=deadline)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    return done


def signed_credential(
    address: str,
    action: str,
    table: str,
    verify: Callable[[int, str, str], str | None],
    *,
    timeout: float = PROBE_DEADLINE_S,
) -> str | None:
    """A MetaService credential for ``action`` on ``table`` at the log service at
    ``address``, once it proved it holds a writer token (``verify``: the proof's check,
    as :class:`LogProbe` takes it, but blocking); None when it proves nothing (a log
    service without auth, or something else)."""
    origin = origin_of(address)
    if origin is None:
        return None
    nonce = secrets.token_hex(16)
    try:
        with (
            httpx.Client(timeout=timeout, trust_env=False, verify=tls_context()) as client,
            client.stream(
                "GET", f"{origin}{wire.API_PREFIX}/identity", params={"nonce": nonce}
            ) as response,
        ):
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_IDENTITY_BYTES:
                    return None
            if response.status_code != 200:
                return None
        found = json.loads(body)
    except (httpx.HTTPError, ValueError, RecursionError):
        return None
    if not isinstance(found, dict):
        return None
    token_id, mac = found.get("token_id"), found.get("mac")
    if not isinstance(token_id, int) or not isinstance(mac, str) or len(mac) > 200:
        return None
    secret = verify(token_id, nonce, mac)
    return None if secret is None else proof.sign(secret, token_id, action, table)


# Origins that gave no proof lately, per process: not called again until then.
_unverified: dict[str, float] = {}


def _remember_unverified(origin: str) -> None:
    now = time.monotonic()
    if len(_unverified) >= _UNVERIFIED_KEPT:
        for stale in [o for o, until in _unverified.items() if until <= now]:
            del _unverified[stale]
        if len(_unverified) >= _UNVERIFIED_KEPT:
            _unverified.clear()
    _unverified[origin] = now + UNVERIFIED_SECONDS


def _unproven(address: str) -> str:
    return (
        f"no log service at {address} proved it holds a writer token (give the log service "
        "one, or add its host to the MetaService's log address allowlist)"
    )


def _not_an_origin(address: str) -> str:
    return f"{address} is not a log service's address: give a scheme, host and port only"


def _client() -> httpx.AsyncClient:
    # No proxies from the environment, no redirects: the call goes where the address says.
    return httpx.AsyncClient(
        timeout=PROBE_DEADLINE_S, trust_env=False, follow_redirects=False, verify=tls_context()
    )


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every call: building one (loading the CA bundle) takes tens of
    milliseconds of the event loop, per client otherwise."""
    return ssl.create_default_context()


async def _get(
    client: httpx.AsyncClient,
    url: str,
    params: dict[str, str],
    headers: dict[str, str],
    *,
    limit: int = MAX_ANSWER_BYTES,
) -> tuple[int, Any]:
    """``(status, JSON body or None)``; _Refused when nothing answers, or too much."""
    address = url.split(wire.API_PREFIX, 1)[0]
    try:
        async with client.stream("GET", url, params=params, headers=headers) as response:
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise _Refused(f"{address} answered more than a log service does")
                chunks.append(chunk)
            status = response.status_code
    except httpx.HTTPError:
        raise _Refused(_no_service(address)) from None
    try:
        return status, json.loads(b"".join(chunks))
    except (ValueError, RecursionError):
        return status, None
