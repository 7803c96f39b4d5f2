"""``metaservice job show|delete|release-grant`` and ``metaservice batch abandon``: one job,
and a dead driver's open batch."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from metaservice import cli_output as fmt
from metaservice.barriers.schemas import BatchBarrier
from metaservice.topology.schemas import JobView

job_app = typer.Typer(help="Show, delete and operate on one job.", no_args_is_help=True)
batch_app = typer.Typer(help="Operate on a job's batches.", no_args_is_help=True)


@job_app.command("show")
def job_show(
    name: Annotated[str, typer.Argument(help="Job name")],
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """A job's kind, inputs, outputs, status, frontier, last batch and barrier."""
    fmt.answer(url, token, lambda ms: ms.get_job(name), _show_job, output=output)


def _show_job(out: fmt.Printer, job: JobView) -> None:
    now = fmt.now_ms()
    rows = [
        ("kind", job.kind),
        ("inputs", ", ".join(job.inputs) or "-"),
        ("outputs", ", ".join(job.outputs)),
        ("status", job.status),
        ("frontier", fmt.frontier(job.frontier, now=now)),
        ("last batch", "-" if job.last_batch_id is None else str(job.last_batch_id)),
        ("last barrier", fmt.when(job.last_barrier, none="-", now=now)),
        ("pending target", fmt.when(job.pending_target, none="-", now=now)),
        ("last seen", fmt.when(job.last_seen_ms, now=now)),
        ("offline floor", fmt.when(job.offline_floor, none="-", now=now)),
        ("description", job.description or "-"),
    ]
    out.table(f"job {job.name}", ("field", "value"), rows)


@job_app.command("delete")
def job_delete(
    name: Annotated[str, typer.Argument(help="Job name")],
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Remove a job, its edges and its barrier history (admin); its outputs lose their
    writer. Refused while another job reads one of its outputs."""
    fmt.answer(
        url,
        token,
        lambda ms: ms.delete_job(name),
        lambda out, _: out.line(f"job {escape(name)} deleted"),
    )


@job_app.command("release-grant")
def job_release_grant(
    name: Annotated[str, typer.Argument(help="Job name")],
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Release a source job's offline grant (writer): its frontier no longer stays below
    the grant's floor. Releasing a grant the job does not hold is fine."""
    fmt.answer(
        url,
        token,
        lambda ms: ms.release_offline_grant(name),
        lambda out, _: out.line(f"offline grant of job {escape(name)} released"),
    )


@batch_app.command("abandon")
def batch_abandon(
    job: Annotated[str, typer.Argument(help="Job name")],
    batch_id: Annotated[int, typer.Argument(help="The open batch a dead driver left behind")],
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Give up a dead source driver's open batch (admin): its tables stop waiting for it.

    A late commit report of the batch is refused; a restarted driver that replays it
    gets a new barrier.
    """
    fmt.answer(
        url, token, lambda ms: ms.abandon_batch(job, batch_id), _show_abandoned, output=output
    )


def _show_abandoned(out: fmt.Printer, view: BatchBarrier) -> None:
    out.line(
        f"batch {view.batch_id} of job {escape(view.job)} (barrier {fmt.when(view.barrier)}) "
        "abandoned"
    )
