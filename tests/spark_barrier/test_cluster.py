"""The standalone test cluster runs a job's tasks on its workers' executors, in processes
other than the driver, and both sides reach a shared folder (tests/cluster.py)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import REPO_ROOT, StandaloneCluster
from tests.s3 import S3Server
from tests.spark_barrier.cluster_smoke_driver import PARTITIONS, ROWS

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def run_smoke_driver(cluster: StandaloneCluster, out: Path) -> dict[str, Any]:
    args = ["--master", cluster.master_url, "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark_barrier.cluster_smoke_driver", *args],
        cwd=REPO_ROOT,
        env=cluster.driver_env(),
        timeout=300,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, (
        f"smoke driver exited with {done.returncode}:\n{done.stderr[-6000:]}\n{cluster.logs()}"
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _tail(log: Path, lines: int = 120) -> str:
    """The end of a driver's output, its own lines before Spark's (they are interleaved)."""
    text = log.read_text().splitlines()
    own = [line for line in text if not line.startswith(("WARN", "WARNING", "\tat ", "26/"))]
    return "\n".join(own[-lines:])


def _stacks(driver: subprocess.Popen[str], log: Path) -> str:
    """Where a stalled driver waits: its Python threads (the demo prints them on SIGUSR1)
    and its JVM's streaming-query threads (jstack)."""
    printed_from = log.stat().st_size
    driver.send_signal(signal.SIGUSR1)
    time.sleep(2)
    python = log.read_text(errors="replace")[printed_from:]
    jvms = subprocess.run(
        ["pgrep", "-P", str(driver.pid), "java"], capture_output=True, text=True
    ).stdout.split()
    queries = []
    for pid in jvms:
        dump = subprocess.run(["jstack", pid], capture_output=True, text=True, timeout=60).stdout
        queries += [t for t in dump.split("\n\n") if "sql.execution.streaming" in t]
    return (
        f"== Python threads of the driver ==\n{python}\n"
        f"== JVM threads of its streaming queries ==\n" + "\n\n".join(queries)
    )


def worker_of(task: dict[str, Any], cluster: StandaloneCluster) -> int:
    """The index of the cluster worker whose executor ran `task`, from the task's working
    folder (an executor runs in <work-dir>/<app-id>/<executor-id>)."""
    cwd = Path(task["cwd"])
    owners = [i for i, work in enumerate(cluster.work_dirs) if cwd.is_relative_to(work)]
    assert owners, f"task ran in {cwd}, under no worker's work folder {cluster.work_dirs}"
    return owners[0]


def test_job_runs_on_the_cluster_workers_executors_not_in_the_driver(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    result = run_smoke_driver(spark_cluster, tmp_path)

    tasks = result["tasks"]
    assert sorted(t["partition"] for t in tasks) == list(range(PARTITIONS))
    assert sum(t["rows"] for t in tasks) == ROWS
    for task in tasks:
        assert task["pid"] != result["driver_pid"]
        assert result["driver_pid"] not in task["ppid_chain"], "task ran under the driver"
        # Python worker <- executor JVM <- worker JVM: the worker is among its ancestors.
        worker_pid = spark_cluster.worker_pids[worker_of(task, spark_cluster)]
        assert worker_pid in task["ppid_chain"], f"task {task} not under worker {worker_pid}"
    # The session starts once every executor registered, so the tasks spread over both.
    assert {worker_of(t, spark_cluster) for t in tasks} == set(range(spark_cluster.workers))

    assert result["rows_read"] == ROWS
    assert list((tmp_path / "numbers.parquet").glob("part-*.parquet")), "no Parquet parts"
    status = spark_cluster.status()
    apps = [app["id"] for app in status["activeapps"] + status["completedapps"]]
    assert result["app_id"] in apps, f"the master never ran app {result['app_id']}: {apps}"


def test_demo_pipeline_runs_on_the_cluster_with_its_tables_on_s3(
    spark_cluster: StandaloneCluster, s3_server: S3Server, tmp_path: Path
) -> None:
    """The demo (CDC into partitioned ODS tables, changelog reads downstream) as a driver
    on the cluster, every table on the S3 server: its check holds at every consistent
    version it samples, and the data files are objects on S3, not local files."""
    tables = s3_server.warehouse(f"demo-{uuid.uuid4().hex[:8]}")
    args = [
        *("--master", spark_cluster.master_url),
        *("--warehouse", str(tmp_path / "demo")),
        *("--tables", tables),
        *[
            a
            for key, value in s3_server.properties.items()
            for a in ("--catalog-property", f"{key}={value}")
        ],
        *("--duration", "20", "--check-every", "8", "--min-checks", "2"),
        *("--orders-per-second", "20"),
    ]
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "examples.streaming_warehouse", *args],
            cwd=REPO_ROOT,
            env={**spark_cluster.driver_env(), "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            returncode = demo.wait(timeout=600)
        except subprocess.TimeoutExpired:
            tail, stacks = _tail(log), _stacks(demo, log)
            demo.kill()
            demo.wait()
            pytest.fail(
                f"demo still running after 600 s:\n{tail}\n{stacks}\n{spark_cluster.logs()}"
            )
    output = log.read_text()
    assert returncode == 0, f"demo exited with {returncode}:\n{_tail(log)}\n{spark_cluster.logs()}"
    checks = re.search(r"checks at consistent versions: (\d+), failed: (\d+)", output)
    assert checks is not None, _tail(log)
    assert int(checks.group(1)) >= 3 and checks.group(2) == "0", _tail(log)
    assert "Spark master: " + spark_cluster.master_url in output
    data_files = [k for k in s3_server.keys(tables) if k.endswith(".parquet")]
    for table in ("orders", "items", "order_detail", "item_revenue"):
        assert any(f"/{table}/" in k for k in data_files), f"no data files of {table} on S3"
    assert not list((tmp_path / "demo").glob("**/*.parquet")), "data files written locally"
