"""Crash points for fault-injection tests of exactly-once delivery.

``SPARK_BARRIER_CRASH_AT=<point>:<batch_id>`` makes the driver process exit at once
(``os._exit``, no cleanup, like a killed driver) when batch ``batch_id`` reaches
``point`` (``<point>:*``: the first batch that reaches it). Points: ``after_write`` (data files written, not committed),
``after_commit`` (Iceberg snapshot committed, not reported). Unset in production.
"""

from __future__ import annotations

import os

ENV = "SPARK_BARRIER_CRASH_AT"
EXIT_CODE = 97


def crash_point(point: str, batch_id: int) -> None:
    wanted = os.environ.get(ENV)
    if wanted and wanted in (f"{point}:{batch_id}", f"{point}:*"):
        os._exit(EXIT_CODE)
