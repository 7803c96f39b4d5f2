"""``metaservice lineage``: the jobs and tables a table comes from and feeds, or the input
snapshots that made one snapshot."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.tree import Tree

from metaservice import cli_output as fmt
from metaservice.lineage.schemas import LineageGraph, SnapshotLineage


def lineage(
    table: Annotated[str, typer.Argument(help="Table identifier, e.g. dws.item_revenue")],
    direction: Annotated[
        str, typer.Option(help="upstream, downstream or both (as the API and the client)")
    ] = "both",
    depth: Annotated[
        int | None, typer.Option(help="Jobs away from the table (all by default)")
    ] = None,
    snapshot: Annotated[
        int | None,
        typer.Option(
            "--snapshot",
            help="Instead: the data lineage of this snapshot (its job, batch, barrier and the "
            "input snapshot ranges it consumed)",
        ),
    ] = None,
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Show the jobs and tables a table comes from and feeds, as trees (or, with
    --snapshot, which input snapshots made one snapshot)."""
    if snapshot is not None:
        fmt.answer(
            url,
            token,
            lambda ms: ms.snapshot_lineage(table, snapshot),
            _show_snapshot_lineage,
            output=output,
        )
        return
    fmt.answer(
        url,
        token,
        lambda ms: ms.lineage(table, direction=direction, depth=depth),
        lambda out, graph: _show_graph(out, graph, direction),
        output=output,
    )


def _show_graph(out: fmt.Printer, graph: LineageGraph, direction: str) -> None:
    kinds = {n.id: n for n in graph.nodes}
    parents: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    for e in graph.edges:
        parents.setdefault(e.target, []).append(e.source)
        children.setdefault(e.source, []).append(e.target)

    def label(node_id: str) -> str:
        node = kinds[node_id]
        name = escape(node.name)
        return f"[cyan]{name}[/]" if node.kind == "table" else f"[yellow]job {name}[/]"

    def grow(tree: Tree, node_id: str, links: dict[str, list[str]], seen: frozenset[str]) -> None:
        for nxt in sorted(links.get(node_id, [])):
            if nxt not in seen:
                grow(tree.add(label(nxt)), nxt, links, seen | {nxt})

    if direction in ("upstream", "both"):
        up = Tree(f"{label(graph.root)} [dim]comes from[/]")
        grow(up, graph.root, parents, frozenset({graph.root}))
        out.console.print(up, soft_wrap=out.plain)
    if direction in ("downstream", "both"):
        down = Tree(f"{label(graph.root)} [dim]feeds[/]")
        grow(down, graph.root, children, frozenset({graph.root}))
        out.console.print(down, soft_wrap=out.plain)


def _show_snapshot_lineage(out: fmt.Printer, made: SnapshotLineage) -> None:
    out.line(
        f"snapshot {made.snapshot_id} of [bold]{escape(made.table)}[/]: job "
        f"{escape(made.job)} batch {made.batch_id}, barrier {made.barrier} "
        f"({fmt.when(made.barrier)})"
    )
    if not made.inputs:
        out.line("a source job's snapshot: it read no table")
        return
    out.table(
        f"{len(made.inputs)} inputs",
        ("input", "after snapshot", "up to snapshot", "barriers"),
        [
            (
                i.table,
                "(start)" if i.from_snapshot is None else str(i.from_snapshot),
                "(empty)" if i.to_snapshot is None else str(i.to_snapshot),
                f"({i.from_barrier}, {i.to_barrier}]",
            )
            for i in made.inputs
        ],
    )
