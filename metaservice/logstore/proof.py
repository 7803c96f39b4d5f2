"""What a log service and the MetaService prove to each other, keyed by the log service's
own token (standard library only: both sides import it).

A log service that checks tokens holds one of its own (a writer token: the writing
driver's for an embedded log, ``metaservice log start --token-file`` for an external
one). The MetaService stores only each token's SHA-256, so that hash is the secret the
two share, and neither sends it:

- **The log service proves it holds a token** (:func:`identity_mac`): asked
  ``GET /v1/identity?nonce=N`` it answers its token's id and an HMAC of the nonce under
  its token's hash. The MetaService checks it against the hash it stores (and that the
  token is a writer's, not revoked) before it calls anything else at that address: an
  address that does not answer so is no log service, and is left alone.
- **The MetaService proves it is the MetaService** (:func:`sign`): to read a log
  service's status (a reader's right) or reset a table's log at a revision swap (a
  writer's), it sends a credential signed under the same hash, for one table, one
  action and one minute; the log service checks it without a round trip
  (:func:`verify`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

__all__ = [
    "CREDENTIAL_PREFIX",
    "READ_STATUS",
    "RESET",
    "identity_mac",
    "sign",
    "token_hash",
    "verify",
]

CREDENTIAL_PREFIX = "mslog1."
READ_STATUS = "status"  # a reader's right, on one table
RESET = "reset"  # a writer's right to reset one table's log
ACTIONS = (READ_STATUS, RESET)
CREDENTIAL_SECONDS = 60.0


def token_hash(token: str) -> str:
    """A token's SHA-256, as the MetaService stores it (``metaservice.auth.service``)."""
    return hashlib.sha256(token.encode()).hexdigest()


def identity_mac(secret_hash: str, nonce: str) -> str:
    return _mac(secret_hash, f"identity.{nonce}")


def sign(
    secret_hash: str, token_id: int, action: str, table: str, *, now: float | None = None
) -> str:
    """A MetaService credential for ``action`` on ``table``, valid for a minute."""
    expires_ms = int(((time.time() if now is None else now) + CREDENTIAL_SECONDS) * 1000)
    text = f"{token_id}.{action}.{expires_ms}.{_b64(table)}"
    return f"{CREDENTIAL_PREFIX}{text}.{_mac(secret_hash, text)}"


def verify(
    credential: str, secret_hash: str, token_id: int, *, now: float | None = None
) -> tuple[str, str] | None:
    """``(action, table)`` of a valid, unexpired MetaService credential signed for this
    token; None for anything else."""
    if not credential.startswith(CREDENTIAL_PREFIX) or len(credential) > 1000:
        return None
    text, _, mac = credential.removeprefix(CREDENTIAL_PREFIX).rpartition(".")
    parts = text.split(".")
    if len(parts) != 4 or not hmac.compare_digest(mac, _mac(secret_hash, text)):
        return None
    signed_id, action, expires_ms, table = parts
    if signed_id != str(token_id) or action not in ACTIONS or not expires_ms.isdigit():
        return None
    if int(expires_ms) < (time.time() if now is None else now) * 1000:
        return None
    try:
        return action, base64.urlsafe_b64decode(table.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def _mac(secret_hash: str, text: str) -> str:
    return hmac.new(secret_hash.encode(), text.encode(), hashlib.sha256).hexdigest()


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()
