"""No import circles in ``metaservice`` and ``spark_barrier``, and dependencies one way:
``spark_barrier`` imports ``metaservice`` (client, contract, catalog loading), never back.

The graph is read from the source files' AST, not by importing them: an edge for each
import a module runs when it is loaded (its top-level statements, including those inside
a top-level ``if`` or ``try``), none for imports inside functions (they run on first
call, after every module is loaded) nor for those under ``if TYPE_CHECKING:`` (they never
run). ``from package import name`` leads to ``package.name`` when that is a module of the
tree, else to ``package``.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("metaservice", "spark_barrier")

# Circles known and left for now, each by its modules, with why. A circle that grows, or
# one that is gone (then delete its entry), fails the test.
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def modules_of(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (its file, whether it is a package's ``__init__``)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def load_time_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when a module with this body is loaded."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from load_time_imports(node.body)
            yield from load_time_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from load_time_imports(block)
            for handler in node.handlers:
                yield from load_time_imports(handler.body)
        elif isinstance(node, ast.With):
            yield from load_time_imports(node.body)


def imported_modules(
    node: ast.Import | ast.ImportFrom, package: str, known: dict[str, tuple[Path, bool]]
) -> Iterator[str]:
    """The modules of the tree that one import statement loads (``package``: the
    package the importing module is in, for relative imports)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in known else base


def import_graph(root: Path, packages: tuple[str, ...]) -> nx.DiGraph:
    known = modules_of(root, packages)
    graph = nx.DiGraph()
    for name, (path, is_package) in known.items():
        graph.add_node(name)
        package = name if is_package else name.rpartition(".")[0]
        for node in load_time_imports(ast.parse(path.read_text(), str(path)).body):
            for target in imported_modules(node, package, known):
                if target in known and target != name:
                    graph.add_edge(name, target)
    return graph


def import_cycles(graph: nx.DiGraph) -> dict[frozenset[str], str]:
    """Each circle (a strongly connected set of modules) and one cycle through it."""
    cycles = {}
    for members in nx.strongly_connected_components(graph):
        if len(members) > 1:
            edges = nx.find_cycle(graph.subgraph(members))
            cycles[frozenset(members)] = " -> ".join([a for a, _ in edges] + [edges[0][0]])
    return cycles


def test_the_packages_import_no_circle_beyond_the_known_ones() -> None:
    cycles = import_cycles(import_graph(ROOT, PACKAGES))
    new = [cycle for members, cycle in cycles.items() if members not in KNOWN_CYCLES]
    gone = [cycle for members, cycle in KNOWN_CYCLES.items() if members not in cycles]
    assert not new, "modules that import each other when loaded: " + "; ".join(new)
    assert not gone, "known circles no longer found; delete them from KNOWN_CYCLES: " + (
        "; ".join(gone)
    )


def test_a_circle_of_top_level_imports_is_found_and_named(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "try:\n    from . import c\nexcept ImportError:\n    pass\n",
        "pkg/c.py": "import pkg.a\n",
        # Neither of these makes a circle: one runs on first call, one never runs.
        "pkg/late.py": "def f():\n    from pkg import early\n",
        "pkg/early.py": (
            "from typing import TYPE_CHECKING\n"
            "from pkg.late import f\n"
            "if TYPE_CHECKING:\n    from pkg import late\n"
        ),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))

    cycles = import_cycles(import_graph(tmp_path, ("pkg",)))

    assert list(cycles) == [frozenset({"pkg.a", "pkg.b", "pkg.c"})]
    named = cycles[frozenset({"pkg.a", "pkg.b", "pkg.c"})].split(" -> ")
    assert len(named) == 4 and named[0] == named[-1]
    assert set(named) == {"pkg.a", "pkg.b", "pkg.c"}


# -- one way: the service never imports the Spark side ------------------------------------


def imports_of(root: Path, package: str, target: str) -> list[str]:
    """``module:line`` of every import of ``target`` (or a module in it) anywhere in
    ``package``: at load time, inside functions and under ``TYPE_CHECKING`` alike."""
    found = []
    for name, (path, is_package) in modules_of(root, (package,)).items():
        base = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
                if node.level:
                    parts = base.split(".")
                    names = [".".join(parts[: len(parts) - (node.level - 1)])]
            else:
                continue
            if any(n == target or n.startswith(target + ".") for n in names):
                found.append(f"{name}:{node.lineno}")
    return sorted(found)


def test_metaservice_never_imports_spark_barrier() -> None:
    # Catalogs are loaded by metaservice.catalog_loading, which both sides import.
    assert imports_of(ROOT, "metaservice", "spark_barrier") == []


def test_an_import_of_the_other_package_is_found_wherever_it_is(tmp_path: Path) -> None:
    files = {
        "svc/__init__.py": "",
        "svc/top.py": "import other.a\n",
        "svc/late.py": "def f():\n    from other.b import g\n",
        "svc/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import other\n",
        "svc/fine.py": "import otherwise\nfrom . import top\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    assert imports_of(tmp_path, "svc", "other") == ["svc.late:2", "svc.top:1", "svc.typed:3"]
