"""The log store: a low-latency, at-least-once copy of a table's newest rows between
barrier commits (see docs/user-guide.md, "Log store").

- :mod:`~metaservice.logstore.store`: the in-memory log per table (offsets, retention,
  epochs).
- :mod:`~metaservice.logstore.server`: the log service over HTTP, embedded
  (:class:`~metaservice.logstore.server.LogService`) or standalone
  (``metaservice log start``). Only this module imports Starlette and uvicorn.
- :mod:`~metaservice.logstore.client`: :class:`LogWriter` (executors, the writing
  driver) and :class:`LogClient`.
- :mod:`~metaservice.logstore.reader`: :class:`LogReader`, which falls back to the
  table's Iceberg snapshots (pyiceberg) when the log cannot serve it.

Importing this package loads nothing: each name below is imported on first use, so
``metaservice log status`` (which needs only httpx) runs on the base install. None of
it imports pyspark; only the server module imports the server's dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metaservice.logstore.client import (
        LogApiError,
        LogClient,
        LogError,
        LogFullError,
        LogGoneError,
        LogResetError,
        LogUnavailable,
        LogWriter,
    )
    from metaservice.logstore.reader import LogNotEnabled, LogReader, log_address

__all__ = [
    "LogApiError",
    "LogClient",
    "LogError",
    "LogFullError",
    "LogGoneError",
    "LogNotEnabled",
    "LogReader",
    "LogResetError",
    "LogUnavailable",
    "LogWriter",
    "log_address",
]

_READER = frozenset({"LogNotEnabled", "LogReader", "log_address"})


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = "reader" if name in _READER else "client"
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
