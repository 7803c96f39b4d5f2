"""What the benchmarks share: facts about the machine, and a throwaway PostgreSQL schema."""

from __future__ import annotations

import contextlib
import os
import platform
import uuid
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import quote


def package_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def host_facts() -> dict[str, Any]:
    """CPU, memory and platform of this machine (figures mean little without them)."""
    model, mem_gb = "", None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": model or platform.processor(),
        "mem_total_gb": mem_gb,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from ``/proc/PID/stat``
    (OSError when the process is gone)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def spread(values: Sequence[float]) -> dict[str, float] | None:
    """n, p50, p90, p99 and max of ``values`` (None when there are none)."""
    if not values:
        return None
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@contextlib.contextmanager
def pg_schema(pg_base: str, prefix: str) -> Iterator[str]:
    """The URL of a fresh PostgreSQL schema named ``<prefix>_<random>``, dropped afterwards."""
    from sqlalchemy import create_engine, text

    schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(pg_base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    joiner = "&" if "?" in pg_base else "?"
    try:
        yield f"{pg_base}{joiner}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()
