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

Importing this package loads the client side only (httpx, pyarrow): no pyspark, no
server.
"""

from metaservice.logstore.client import (
    LogApiError,
    LogClient,
    LogError,
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
    "LogGoneError",
    "LogNotEnabled",
    "LogReader",
    "LogResetError",
    "LogUnavailable",
    "LogWriter",
    "log_address",
]
