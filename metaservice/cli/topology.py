"""``metaservice topology``, ``tables`` and ``snapshots``: the jobs and tables the service
knows, and a table's snapshots."""

from __future__ import annotations

from typing import Annotated

import typer

from metaservice import cli_output as fmt
from metaservice.schemas_common import Page
from metaservice.topology.schemas import JobView, SnapshotView, TableView


def topology(
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Show every job with its inputs, outputs, status and frontier."""
    fmt.answer(url, token, lambda ms: ms.all_jobs(), _show_jobs, output=output)


def _show_jobs(out: fmt.Printer, jobs: list[JobView]) -> None:
    out.table(
        f"{len(jobs)} jobs",
        ("job", "kind", "inputs", "outputs", "status", "frontier"),
        [
            (
                j.name,
                j.kind,
                ", ".join(j.inputs) or "-",
                ", ".join(j.outputs),
                j.status,
                fmt.frontier(j.frontier),
            )
            for j in jobs
        ],
    )


def tables(
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Show every table with its writer, frontier, latest snapshot and delay."""
    fmt.answer(url, token, lambda ms: ms.all_tables(), _show_tables, output=output)


def _show_tables(out: fmt.Printer, items: list[TableView]) -> None:
    out.table(
        f"{len(items)} tables",
        ("table", "writer", "readers", "frontier", "latest snapshot", "delay"),
        [
            (
                t.name,
                t.writer or "-",
                ", ".join(t.readers) or "-",
                fmt.frontier(t.frontier, written=t.writer is not None),
                str(t.latest_snapshot if t.latest_snapshot is not None else "-"),
                fmt.behind(t.delay_ms, written=t.writer is not None),
            )
            for t in items
        ],
    )


def snapshots(
    table: Annotated[str, typer.Argument(help="Table identifier, e.g. dwd.order_detail")],
    from_barrier: Annotated[
        int | None, fmt.barrier_option("--from", help="Only barriers at or after this")
    ] = None,
    to_barrier: Annotated[
        int | None, fmt.barrier_option("--to", help="Only barriers at or before this")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many")] = 100,
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Show a table's snapshots with their barriers, jobs and batches (oldest first)."""

    def show(out: fmt.Printer, page: Page[SnapshotView]) -> None:
        now = fmt.now_ms()
        out.table(
            f"{len(page.items)} of {page.total} snapshots of {table}",
            ("snapshot", "barrier", "time", "job", "batch", "reported"),
            [
                (
                    "(no rows)" if s.snapshot_id is None else str(s.snapshot_id),
                    str(s.barrier),
                    fmt.when(s.barrier, now=now),
                    s.job or "(deleted)",
                    str(s.batch_id),
                    fmt.ago(s.reported_ms, now),
                )
                for s in page.items
            ],
        )

    fmt.answer(
        url,
        token,
        lambda ms: ms.table_snapshots(
            table, from_barrier=from_barrier, to_barrier=to_barrier, limit=limit
        ),
        show,
        output=output,
    )
