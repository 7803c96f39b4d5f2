"""Who may call a log service: bearer tokens the MetaService accepts.

A log service with auth (:class:`LogAuth`) asks the MetaService what each bearer token
is (``GET /api/v1/whoami`` with that token: its role and scope), and keeps the answer
for ``cache_seconds`` (a revoked token keeps working here for at most that long; a
refused one is asked again after a few seconds). Writers append, mark persisted, reset
and claim spilled files; readers read and see the status. The MetaService's own calls
(the status it shows, the reset at a revision swap) bring a credential signed under the
log service's own token (:mod:`metaservice.logstore.proof`), checked here without a
round trip.

Without auth a log service serves anyone who reaches it, so it listens on loopback only
(:func:`check_listen`).
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from metaservice.auth.schemas import Role
from metaservice.errors import Forbidden, ServiceError, Unauthenticated
from metaservice.logstore import proof
from metaservice.logstore.probe import tls_context

__all__ = ["Access", "LogAuth", "LogAuthError", "check_listen", "is_loopback"]

WHOAMI_PATH = "/api/v1/whoami"
_REFUSED_SECONDS = 3.0  # how long a refused token's answer is kept
_CACHE_MAX = 10_000
_MAX_TOKEN_CHARS = 1000


class LogAuthError(RuntimeError):
    """A log service cannot be started as asked (say, beyond loopback without auth)."""


class MetaServiceUnavailable(ServiceError):
    status = 503
    code = "auth_unavailable"


@dataclass(frozen=True)
class Access:
    """What a caller may do here: its role, and (a MetaService credential) the one
    table and action it was signed for."""

    role: Role
    table: str | None = None
    action: str | None = None
    writes_table: bool | None = None  # asked for the table written: may it write it

    def check(self, needed: Role, table: str | None, action: str) -> None:
        if not self.role.includes(needed):
            raise Forbidden(
                f"this needs a {needed.value} token; this one has the {self.role.value} role",
                code="forbidden",
            )
        if needed is Role.WRITER and self.writes_table is False:
            raise Forbidden(
                f"this writer token is scoped to jobs, none of which writes {table}: use a "
                "token of the table's writer",
                code="out_of_scope",
            )
        if self.table is not None and (self.table != table or self.action != action):
            raise Forbidden("this credential is for another table or action", code="forbidden")


@dataclass
class LogAuth:
    """Check bearer tokens with the MetaService at ``metaservice_url``. ``token``: the log
    service's own (a writer's), with which it proves to the MetaService that it is a log
    service (:mod:`~metaservice.logstore.proof`); without one the MetaService leaves its
    address alone (unless the address is in its allowlist)."""

    metaservice_url: str
    token: str | None = None
    cache_seconds: float = 10.0
    timeout: float = 5.0
    token_id: int | None = None  # the own token's, learned at start
    _cache: dict[tuple[str, str | None], tuple[float, Access | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.metaservice_url = self.metaservice_url.rstrip("/")

    # -- at start -------------------------------------------------------------------
    def check_metaservice(self) -> bool:
        """Whether the MetaService requires tokens (so this service's checks mean
        something); learns the own token's id. LogAuthError when it cannot tell."""
        try:
            anonymous = httpx.get(self.metaservice_url + WHOAMI_PATH, timeout=self.timeout)
            own = (
                httpx.get(
                    self.metaservice_url + WHOAMI_PATH,
                    headers={"Authorization": f"Bearer {self.token}"},
                    timeout=self.timeout,
                )
                if self.token
                else None
            )
        except httpx.HTTPError as exc:
            raise LogAuthError(
                f"the MetaService at {self.metaservice_url} does not answer ({exc}); the log "
                "service checks every token with it"
            ) from None
        if anonymous.status_code == 404:
            raise LogAuthError(
                f"the MetaService at {self.metaservice_url} has no {WHOAMI_PATH}: it is older "
                "than this log service; upgrade it"
            )
        if own is not None:
            if own.status_code != 200:
                raise LogAuthError(
                    f"the MetaService at {self.metaservice_url} refuses the log service's "
                    f"token ({own.status_code}): give it a valid writer token"
                )
            answer = own.json()
            if not Role(answer["role"]).includes(Role.WRITER):
                raise LogAuthError(
                    "the log service's own token must be a writer's (it proves the service "
                    f"is one the MetaService may ask); this one is a {answer['role']}'s"
                )
            self.token_id = answer.get("token_id")
        return anonymous.status_code == 401

    # -- per request ----------------------------------------------------------------
    async def access(self, authorization: str | None, writing: str | None = None) -> Access:
        """The caller's access (``writing``: the table it writes, whose writer a scoped
        writer must act for); 401 without a token the MetaService accepts."""
        scheme, _, credential = (authorization or "").partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            raise Unauthenticated(
                "the log service needs a bearer token the MetaService accepts: send "
                "'Authorization: Bearer <token>' (a writer's to write, a reader's to read)"
            )
        if len(credential) > _MAX_TOKEN_CHARS:
            raise Unauthenticated("the bearer token is unknown or revoked")
        if credential.startswith(proof.CREDENTIAL_PREFIX):
            return self._signed(credential)
        key = (proof.token_hash(credential), writing)
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is None or cached[0] < now:
            found = await self._ask(credential, writing)
            keep = self.cache_seconds if found is not None else _REFUSED_SECONDS
            if len(self._cache) >= _CACHE_MAX:
                self._cache = {k: v for k, v in self._cache.items() if v[0] >= now}
                if len(self._cache) >= _CACHE_MAX:
                    self._cache.clear()
            self._cache[key] = cached = (now + keep, found)
        if cached[1] is None:
            raise Unauthenticated("the bearer token is unknown or revoked")
        return cached[1]

    def _signed(self, credential: str) -> Access:
        if self.token is None or self.token_id is None:
            raise Unauthenticated("this log service holds no token to check that credential")
        found = proof.verify(credential, proof.token_hash(self.token), self.token_id)
        if found is None:
            raise Unauthenticated("the credential is not valid (or expired)")
        action, table = found
        role = Role.READER if action == proof.READ_STATUS else Role.WRITER
        return Access(role, table=table, action=action)

    async def _ask(self, token: str, writing: str | None) -> Access | None:
        try:
            async with httpx.AsyncClient(timeout=self.timeout, verify=tls_context()) as client:
                response = await client.get(
                    self.metaservice_url + WHOAMI_PATH,
                    params={} if writing is None else {"table": writing},
                    headers={"Authorization": f"Bearer {token}"},
                )
        except (TimeoutError, httpx.HTTPError):
            raise MetaServiceUnavailable(
                "the log service cannot check the token: the MetaService does not answer; try again"
            ) from None
        if response.status_code in (401, 403):
            return None
        if response.status_code != 200:
            raise MetaServiceUnavailable(
                f"the log service cannot check the token: the MetaService answered "
                f"{response.status_code}; try again"
            )
        try:
            body: dict[str, Any] = response.json()
            writes = body.get("writes_table") if writing is not None else None
            return Access(
                Role(body["role"]), writes_table=writes if writes is None else bool(writes)
            )
        except (ValueError, KeyError, TypeError):
            raise MetaServiceUnavailable(
                "the log service cannot check the token: the MetaService's answer is not one"
            ) from None

    def identity(self, nonce: str) -> dict[str, Any] | None:
        """The proof that this service holds its token (None: it holds none)."""
        if self.token is None or self.token_id is None:
            return None
        return {
            "token_id": self.token_id,
            "mac": proof.identity_mac(proof.token_hash(self.token), nonce),
        }


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, auth: LogAuth | None) -> None:
    """Refuse (LogAuthError) to listen beyond loopback without checking tokens."""
    if is_loopback(host):
        return
    if auth is None:
        raise LogAuthError(
            f"a log service listening on {host} (beyond loopback) must check tokens: run the "
            "MetaService with METASERVICE_AUTH_REQUIRED=true and give the log service its "
            "address and a writer token (`metaservice log start --metaservice-url URL "
            "--token-file FILE`; an embedded log takes register(..., token=...)), or "
            "listen on 127.0.0.1"
        )
    if not auth.check_metaservice():
        raise LogAuthError(
            f"a log service listening on {host} (beyond loopback) must check tokens, and the "
            f"MetaService at {auth.metaservice_url} does not require them: start it with "
            "METASERVICE_AUTH_REQUIRED=true (`metaservice start --auth-required`), or listen "
            "on 127.0.0.1"
        )
