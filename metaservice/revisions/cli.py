"""``metaservice revision create|status|swap|cancel``.

Query commands: they call a running MetaService through the client and need the base
install only (the service makes and drops the mirror tables).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from metaservice import cli_output as fmt
from metaservice.cli_output import (
    DEFAULT_URL,
    JsonFlag,
    Output,
    OutputOption,
    Printer,
    TokenOption,
    UrlOption,
)
from metaservice.client import MetaServiceClient, MetaServiceError
from metaservice.revisions.schemas import RevisionView

app = typer.Typer(
    help="Revise a table and everything downstream of it from a barrier, into mirror "
    "tables written by revision jobs, and swap them in.",
    no_args_is_help=True,
)
_fail = fmt.fail


def _show(out: Printer, view: RevisionView) -> None:
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
    output: OutputOption = Output.table,
    as_json: JsonFlag = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Plan a revision of TABLE and everything downstream of it (admin): a mirror table of
    each, starting at its snapshot at the barrier (no data is copied), and the jobs to
    re-run on them."""
    out = Printer(output, json_flag=as_json)
    try:
        with MetaServiceClient(url, token=token) as ms:
            view = ms.create_revision(table, from_barrier)
    except MetaServiceError as exc:
        raise _fail(str(exc)) from exc
    if out.json:
        return out.dump(view)
    _show(out, view)


@app.command("status")
def status(
    revision_id: Annotated[
        int | None, typer.Argument(help="The revision's id; left out: list every revision")
    ] = None,
    output: OutputOption = Output.table,
    as_json: JsonFlag = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """A revision's state, its mirrors' start snapshots, frontiers and lag (or a list)."""
    out = Printer(output, json_flag=as_json)
    try:
        with MetaServiceClient(url, token=token) as ms:
            if revision_id is not None:
                view = ms.get_revision(revision_id)
            else:
                items = ms.all_revisions()
    except MetaServiceError as exc:
        raise _fail(str(exc)) from exc
    if revision_id is not None:
        if out.json:
            return out.dump(view)
        return _show(out, view)
    if out.json:
        return out.dump(items)
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
    output: OutputOption = Output.table,
    as_json: JsonFlag = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Swap a ready revision's mirrors in for their originals (admin): the original jobs
    are superseded, and once the mirrors have caught up the tables change names in one
    step. Exit status 2 while it is still swapping (run it again to continue)."""
    out = Printer(output, json_flag=as_json)
    try:
        with MetaServiceClient(url, token=token) as ms:
            view = ms.swap_revision(revision_id, wait_seconds=wait)
    except MetaServiceError as exc:
        raise _fail(str(exc)) from exc
    if out.json:
        out.dump(view)
    elif view.state == "swapped":
        out.line(
            f"revision [bold]{view.id}[/] swapped: "
            + ", ".join(f"{escape(m.table)} is the former {escape(m.mirror)}" for m in view.tables)
        )
    else:
        out.line(
            f"revision [bold]{view.id}[/] is still {view.state}: its original jobs are "
            "superseded and its mirrors are catching up; run this again to continue"
        )
    if view.state != "swapped":
        raise typer.Exit(code=2)


@app.command("cancel")
def cancel(
    revision_id: Annotated[int, typer.Argument(help="The revision's id")],
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Cancel a revision (admin): its mirrors are dropped from the catalog, and no file is
    deleted (they are the originals'). Cancelling twice is fine."""
    out = Printer(output)
    try:
        with MetaServiceClient(url, token=token) as ms:
            view = ms.cancel_revision(revision_id)
    except MetaServiceError as exc:
        raise _fail(str(exc)) from exc
    if out.json:
        return out.dump(view)
    out.line(
        f"revision [bold]{view.id}[/] cancelled: {len(view.tables)} mirrors dropped "
        "(no file deleted)"
    )
