"""Errors that carry their HTTP status.

Services raise these; one exception handler turns them into
``{"code": ..., "message": ..., "field": ...}``. Services never import FastAPI.

    ServiceError
    ├── Unauthenticated  401  no bearer token, or one the service does not know
    ├── Forbidden        403  the token's role is too small for the request
    ├── Invalid          422  the request is well-formed but breaks a rule
    ├── NotFound         404  a job, table, lease or snapshot that does not exist
    ├── Conflict         409  contradicts what is recorded (cycle, second writer, other snapshot)
    └── TooLarge         413  past a configured bound
"""

from __future__ import annotations


class ServiceError(Exception):
    status = 500
    code = "internal"
    headers: dict[str, str] | None = None

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code

    def to_dict(self) -> dict[str, object]:
        body: dict[str, object] = {"code": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return body


class Unauthenticated(ServiceError):
    status = 401
    code = "unauthenticated"
    headers = {"WWW-Authenticate": "Bearer"}  # noqa: RUF012 (never mutated)


class Forbidden(ServiceError):
    status = 403
    code = "forbidden"


class Invalid(ServiceError):
    status = 422
    code = "invalid"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class TooLarge(ServiceError):
    status = 413
    code = "too_large"
