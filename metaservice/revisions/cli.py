"""``metaservice revision create|status|swap|cancel``.

Query commands: they call a running MetaService through the client and need the base
install only (the service makes and drops the mirror tables).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from metaservice import cli_output as fmt
from metaservice.revisions.schemas import RevisionView

app = typer.Typer(
    help="Revise a table and everything downstream of it from a barrier, into mirror "
    "tables written by revision jobs, and swap them in.",
    no_args_is_help=True,
)


def _show(out: fmt.Printer, view: RevisionView) -> None:
    out.line(
        f"revision [bold]{view.id}[/] of {escape(view.table)} from barrier {view.from_barrier} "
        f"({fmt.when(view.from_barrier)}): {view.state}"
    )
    now = fmt.now_ms()
    out.table(
        f"{len(view.tables)} mirrors",
        ("table", "mirror", "starts at", "writer", "frontier", "lag"),
        [
            (
                m.table,
                m.mirror,
                "(empty)" if m.start_snapshot is None else str(m.start_snapshot),
                m.writer,
                fmt.frontier(m.frontier, now=now),
                fmt.duration(m.lag_ms),
            )
            for m in view.tables
        ],
    )
    for job in view.must_run:
        reads = ", ".join(f"{i.table} from {i.mirror}" for i in job.mirror_inputs) or "originals"
        writes = ", ".join(o.mirror for o in job.outputs)
        out.line(
            f"  run [bold]{escape(job.revision_job)}[/] (job {escape(job.job)} re-run): "
            f"writes {escape(writes)}; reads {escape(reads)}"
        )


@app.command("create")
def create(
    table: Annotated[str, typer.Argument(help="The table to revise, e.g. dw.order_detail")],
    from_barrier: Annotated[
        int, fmt.barrier_option("--from-barrier", help="Revise from this barrier")
    ],
    output: fmt.OutputOption = fmt.Output.table,
    as_json: fmt.JsonFlag = False,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Plan a revision of TABLE and everything downstream of it (admin): a mirror table of
    each, starting at its snapshot at the barrier (no data is copied), and the jobs to
    re-run on them."""
    fmt.answer(
        url,
        token,
        lambda ms: ms.create_revision(table, from_barrier),
        _show,
        output=output,
        json_flag=as_json,
    )


@app.command("status")
def status(
    revision_id: Annotated[
        int | None, typer.Argument(help="The revision's id; left out: list every revision")
    ] = None,
    output: fmt.OutputOption = fmt.Output.table,
    as_json: fmt.JsonFlag = False,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """A revision's state, its mirrors' start snapshots, frontiers and lag (or a list)."""
    if revision_id is not None:
        fmt.answer(
            url,
            token,
            lambda ms: ms.get_revision(revision_id),
            _show,
            output=output,
            json_flag=as_json,
        )
        return
    fmt.answer(url, token, lambda ms: ms.all_revisions(), _list, output=output, json_flag=as_json)


def _list(out: fmt.Printer, items: list[RevisionView]) -> None:
    now = fmt.now_ms()
    out.table(
        f"{len(items)} revisions",
        ("id", "table", "from barrier", "state", "mirrors", "created"),
        [
            (
                str(r.id),
                r.table,
                f"{r.from_barrier} ({fmt.when(r.from_barrier, now=now)})",
                r.state,
                str(len(r.tables)),
                fmt.when(r.created_ms, now=now),
            )
            for r in items
        ],
    )


@app.command("swap")
def swap(
    revision_id: Annotated[int, typer.Argument(help="The revision's id")],
    wait: Annotated[
        float,
        typer.Option("--wait", min=0, max=300, help="Seconds to wait for the mirrors to catch up"),
    ] = 60,
    output: fmt.OutputOption = fmt.Output.table,
    as_json: fmt.JsonFlag = False,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Swap a ready revision's mirrors in for their originals (admin): the original jobs
    are superseded, and once the mirrors have caught up the tables change names in one
    step. Exit status 2 while it is still swapping (run it again to continue)."""
    view = fmt.answer(
        url,
        token,
        lambda ms: ms.swap_revision(revision_id, wait_seconds=wait),
        _show_swap,
        output=output,
        json_flag=as_json,
    )
    if view.state != "swapped":
        raise typer.Exit(code=2)


def _show_swap(out: fmt.Printer, view: RevisionView) -> None:
    if view.state == "swapped":
        out.line(
            f"revision [bold]{view.id}[/] swapped: "
            + ", ".join(f"{escape(m.table)} is the former {escape(m.mirror)}" for m in view.tables)
        )
    else:
        out.line(
            f"revision [bold]{view.id}[/] is still {view.state}: its original jobs are "
            "superseded and its mirrors are catching up; run this again to continue"
        )


@app.command("cancel")
def cancel(
    revision_id: Annotated[int, typer.Argument(help="The revision's id")],
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Cancel a revision (admin): its mirrors are dropped from the catalog, and no file is
    deleted (they are the originals'). Cancelling twice is fine."""
    fmt.answer(
        url, token, lambda ms: ms.cancel_revision(revision_id), _show_cancelled, output=output
    )


def _show_cancelled(out: fmt.Printer, view: RevisionView) -> None:
    out.line(
        f"revision [bold]{view.id}[/] cancelled: {len(view.tables)} mirrors dropped "
        "(no file deleted)"
    )
