"""``metaservice``: run the service, migrate its database, and query a running one.

The whole command tree is put together here, one module a command group (as Prefect's
``cli/``); the commands of a feature with a package of its own live in that package:

========================================  ===============================================
``start``                                 :mod:`metaservice.cli.start`
``db upgrade|current``                    :mod:`metaservice.cli.db`
``token create|list|revoke``              :mod:`metaservice.cli.token`
``reconcile``                             :mod:`metaservice.cli.reconcile`
``topology``, ``tables``, ``snapshots``   :mod:`metaservice.cli.topology`
``lineage``                               :mod:`metaservice.cli.lineage`
``consistent``, ``lease create|release``  :mod:`metaservice.cli.versions`
``delay``                                 :mod:`metaservice.cli.delay`
``job ...``, ``batch abandon``            :mod:`metaservice.cli.jobs`
``expirable``, ``expire``                 :mod:`metaservice.lifecycle.cli`
``catalog``                               :mod:`metaservice.iceberg_rest.cli`
``tag``, ``tags``, ``untag``              :mod:`metaservice.versions.tags.cli`
``revision ...``                          :mod:`metaservice.revisions.cli`
``log start|status``                      :mod:`metaservice.logstore.cli`
========================================  ===============================================

The query commands talk to a running MetaService through the client and need the base
install only; each is one call of :func:`metaservice.cli_output.answer`, which prints a
table or, with ``--output json``, the API's answer (:mod:`metaservice.cli_output` holds
what they share). The commands that run the server's code (``start``, ``db``, ``token``,
``reconcile``) import it inside the command, and say which extra to install when it is
missing (:func:`metaservice.cli.server_code.needs_server`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from metaservice import __version__
from metaservice.cli import delay, jobs, lineage, reconcile, topology, versions
from metaservice.cli.db import db_app
from metaservice.cli.start import start
from metaservice.cli.token import token_app
from metaservice.iceberg_rest import cli as catalog_cli
from metaservice.lifecycle import cli as lifecycle_cli
from metaservice.logstore import cli as log_cli
from metaservice.revisions import cli as revisions_cli
from metaservice.versions.tags import cli as tags_cli

__all__ = ["app"]

app = typer.Typer(
    help="MetaService: timestamp barriers, lineage, delay and consistent versions "
    "for Spark streaming on Apache Iceberg.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _show_version(show: bool) -> None:
    if show:
        typer.echo(f"metaservice {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    # Only for --version: the app's help is the Typer's own.
    pass


# In the order `metaservice --help` lists them (commands, then groups).
app.command("start")(start)
app.command("reconcile")(reconcile.reconcile_tables)
app.command("topology")(topology.topology)
app.command("tables")(topology.tables)
app.command("snapshots")(topology.snapshots)
app.command("lineage")(lineage.lineage)
app.command("consistent")(versions.consistent)
app.command("delay")(delay.delay)
app.command("expirable")(lifecycle_cli.expirable)
app.command("expire")(lifecycle_cli.expire)
app.command("catalog")(catalog_cli.catalog)
app.command("tag")(tags_cli.tag)
app.command("tags")(tags_cli.tags)
app.command("untag")(tags_cli.untag)
app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")
app.add_typer(jobs.job_app, name="job")
app.add_typer(jobs.batch_app, name="batch")
app.add_typer(versions.lease_app, name="lease")
app.add_typer(revisions_cli.app, name="revision")
app.add_typer(log_cli.app, name="log")
