"""The errors of :class:`metaservice.client.MetaServiceClient`, and how an answer maps to one.

Errors:

    MetaServiceError
    ├── Unavailable            the service could not be reached (connection refused, timeout)
    │                          or answered 502/503/504 (e.g. its database is restarting)
    └── ApiError               the service answered 4xx/5xx; .status, .code, .message, .field
        ├── InvalidRequest     400, 413, 422
        ├── NotFoundError      404
        └── ConflictError      409
"""

from __future__ import annotations

from typing import Any

import httpx

from metaservice.barriers.schemas import Carried
from metaservice.error_bodies import error_body


class MetaServiceError(Exception):
    """Anything that went wrong talking to the MetaService."""


class Unavailable(MetaServiceError):
    """The MetaService could not be reached."""


class ApiError(MetaServiceError):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" (field {field})" if field else ""))
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.body = body or {}  # the whole error body (a refused barrier's ``carried``)

    @property
    def carried(self) -> Carried | None:
        """What became of the parts a refused barrier request carried, if it carried any."""
        data = self.body.get("carried")
        return Carried.model_validate(data) if isinstance(data, dict) else None


class InvalidRequest(ApiError):
    pass


class NotFoundError(ApiError):
    pass


class ConflictError(ApiError):
    pass


# Answers that mean "not now" rather than "no": a proxy without a backend, or a
# service whose database is unreachable. Callers retry them like a refused connection.
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})


def error_for(response: httpx.Response) -> ApiError:
    """The error an answer of 4xx/5xx means, from its JSON body (``code``, ``message``,
    ``field``) where it has one."""
    e = error_body(response)
    cls = {404: NotFoundError, 409: ConflictError}.get(e.status)
    if cls is None:
        cls = InvalidRequest if e.status in (400, 413, 422) else ApiError
    return cls(e.status, e.code, e.message, e.field, e.body)
