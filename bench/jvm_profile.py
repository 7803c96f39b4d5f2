"""Where a Spark driver JVM's CPU goes: a Java Flight Recorder recording, summarised.

The JDK's own sampler (JFR, ``settings=profile``) records the driver JVM from its start,
through ``JAVA_TOOL_OPTIONS``, which the JVM that pyspark launches inherits. Each
execution sample is then put in one activity: the first of :data:`ACTIVITIES` that any
frame of its stack names, so work done for a purpose counts for that purpose (bytecode
scanning under the closure cleaner is closure cleaning, analysis done to describe a
plan is a plan description). Executors' JVMs of a standalone cluster are not recorded:
only the driver's.

    options = recording_options(path, delay_s=40, duration_s=60)  # before the JVM starts
    ...
    summary = summarize(path)  # {"samples": ..., "threads": {...}, "activities": {...}}
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

# JFR keeps 64 frames by default; Spark's stacks under a foreachBatch call are deeper,
# and the activity that explains a sample is often near the bottom.
STACK_DEPTH = 1024

# (pattern in a frame, activity), in order of precedence.
ACTIVITIES: tuple[tuple[str, str], ...] = (
    ("ClosureCleaner", "closure cleaning (Spark scans the bytecode of each job's functions)"),
    ("explainString", "plan descriptions (posted to listeners at each SQL execution)"),
    ("SparkPlanInfo", "plan descriptions (posted to listeners at each SQL execution)"),
    ("codegen", "code generation"),
    ("CodeGenerator", "code generation"),
    ("catalyst.analysis", "analysis"),
    ("CheckAnalysis", "analysis"),
    ("catalyst.optimizer", "optimizer"),
    ("SparkOptimizer", "optimizer"),
    ("QueryPlanner", "physical planning"),
    ("SparkStrategies", "physical planning"),
    ("SqlParser", "SQL parsing"),
    ("parquet", "Parquet read and write"),
    (".python.", "Python workers and data sources"),
    ("ObjectOutputStream", "serialization"),
    ("ObjectInputStream", "serialization"),
    ("serializer.", "serialization"),
    ("Executor$TaskRunner", "executor tasks, other"),
    ("HDFSMetadataLog", "streaming checkpoint logs"),
    ("CheckpointFileManager", "streaming checkpoint logs"),
    ("scheduler.", "scheduling"),
    ("adaptive.", "adaptive execution, other (stages, re-planning)"),
    ("py4j.", "Py4J, other"),
)

# (pattern in a thread's name, kind)
THREADS: tuple[tuple[str, str], ...] = (
    ("stream execution thread", "streaming queries (planning, and the sinks' calls from Python)"),
    ("Executor task", "executor tasks"),
    ("QueryStageExecution", "adaptive query stages and exchanges"),
    ("exchange", "adaptive query stages and exchanges"),
    ("dag-scheduler", "scheduling"),
    ("task-result-getter", "scheduling"),
)

_SAMPLE = "jdk.ExecutionSample {"
_THREAD = re.compile(r'sampledThread = "([^"]*)"')
_FRAME = re.compile(r"^\s+([\w$.<>]+)\(.*\)\s+line:", re.M)


def available() -> bool:
    """Whether this machine's JDK has the tool that reads recordings (``jfr``)."""
    return shutil.which("jfr") is not None


def recording_options(path: Path, delay_s: int, duration_s: int) -> str:
    """JVM options that record the JVM for ``duration_s`` after ``delay_s`` into ``path``."""
    return (
        f"-XX:FlightRecorderOptions:stackdepth={STACK_DEPTH} "
        f"-XX:StartFlightRecording=delay={delay_s}s,duration={duration_s}s,"
        f"filename={path},settings=profile"
    )


def summarize(path: Path, top: int = 12) -> dict[str, Any]:
    """The recording's execution samples by thread kind and by activity (shares of all
    samples), and the JVM methods Python called that the streaming threads spent most in."""
    printed = subprocess.run(
        [
            "jfr",
            "print",
            "--stack-depth",
            str(STACK_DEPTH),
            "--events",
            "jdk.ExecutionSample",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    threads: Counter[str] = Counter()
    activities: Counter[str] = Counter()
    called: Counter[str] = Counter()
    samples = printed.split(_SAMPLE)[1:]
    for sample in samples:
        thread = _THREAD.search(sample)
        kind = _kind(thread.group(1) if thread else "")
        frames = _FRAME.findall(sample)
        threads[kind] += 1
        activities[_activity(frames)] += 1
        if kind.startswith("streaming"):
            called[_called_from_python(frames)] += 1
    n = len(samples)
    return {
        "samples": n,
        "threads": _shares(threads, n),
        "activities": _shares(activities, n),
        "streaming_threads_by_method_python_called": _shares(
            Counter(dict(called.most_common(top))), n
        ),
    }


def _kind(thread: str) -> str:
    return next((kind for pattern, kind in THREADS if pattern in thread), "other")


def _activity(frames: list[str]) -> str:
    for pattern, activity in ACTIVITIES:
        if any(pattern in frame for frame in frames):
            return activity
    return "other"


def _called_from_python(frames: list[str]) -> str:
    """The JVM method a Py4J call invoked (the frame under the reflective call), or the
    streaming engine's own work when no Py4J call is on the stack."""
    for i, frame in enumerate(frames):
        if frame.startswith("py4j.reflection.MethodInvoker"):
            for inner in reversed(frames[:i]):
                if not inner.startswith(("jdk.internal.", "java.lang.reflect.")):
                    return re.sub(r"\$\$anonfun.*|\$\d+", "", inner)
    return "(the streaming engine itself)"


def _shares(counts: Counter[str], n: int) -> dict[str, float]:
    return {name: round(count / n, 3) for name, count in counts.most_common()} if n else {}
