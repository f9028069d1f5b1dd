"""The package's import graph, read from the source (every import, function-local and
``TYPE_CHECKING`` ones counted): no module imports another in a circle, and the layers of the
request's path only look down (the request and the dialects below the gateways, the gateways
below the HTTP edge)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "turnstile"

# what each layer may not import (a package or module of turnstile, by dotted prefix)
BELOW = {
    "turnstile.request": ("turnstile.dialects", "turnstile.gateway", "turnstile.server"),
    "turnstile.errors": ("turnstile.dialects", "turnstile.gateway", "turnstile.server"),
    "turnstile.dialects": ("turnstile.gateway", "turnstile.server", "turnstile.engines"),
    "turnstile.gateway": ("turnstile.server", "turnstile.viewer", "turnstile.wiring"),
    "turnstile.engines": ("turnstile.gateway", "turnstile.server", "turnstile.dialects"),
    "turnstile.chat": (
        "turnstile.gateway",
        "turnstile.server",
        "turnstile.engines",
        "turnstile.parsing",
    ),
    "turnstile.store": ("turnstile.gateway", "turnstile.server", "turnstile.dialects"),
}
# the model-family facts are data at the bottom: they import nothing else of turnstile
TOP = (
    "turnstile.request",
    "turnstile.errors",
    "turnstile.dialects",
    "turnstile.gateway",
    "turnstile.engines",
    "turnstile.chat",
    "turnstile.parsing",
    "turnstile.store",
    "turnstile.server",
    "turnstile.wiring",
    "turnstile.converters",
    "turnstile.viewer",
    "turnstile.ray",
    "turnstile.testing",
)
BELOW["turnstile.families"] = TOP


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports (``from pkg import mod`` names the module)."""
    modules = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    mod = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    mod = node.module or ""
                targets = [mod, *(f"{mod}.{a.name}" for a in node.names)]
            edges[name].update(t for t in targets if t in modules and t != name)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    """The check below can fail: a made-up graph with one circle of three."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_another_in_a_circle():
    assert cycles(import_graph()) == []


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_layers_only_import_down():
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in import_graph().items()
        for layer, banned in BELOW.items()
        if _within(source, layer)
        for target in targets
        if any(_within(target, b) for b in banned)
    )
    assert wrong == []


def test_testing_is_a_top_layer_nothing_imports():
    """``turnstile.testing`` (the fakes, the relay) serves the tests and benchmarks: no module
    of the package outside it imports it, so a fake never reaches a request's path."""
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in import_graph().items()
        if not _within(source, "turnstile.testing")
        for target in targets
        if _within(target, "turnstile.testing")
    )
    assert wrong == []


def test_the_server_is_the_http_edge_only():
    """``server/`` holds the HTTP edge: no gateway (a call's lifecycle) and no dialect lives
    there, and the gateways and dialects never reach up into it."""
    names = {p.stem for p in (PACKAGE / "server").glob("*.py")}
    assert not names & {"gateway", "passthrough", "requests", "chat_completions", "record"}
