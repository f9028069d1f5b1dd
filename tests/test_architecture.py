"""The package's import graph, read from the source (every import, function-local and
``TYPE_CHECKING`` ones counted): no module imports another in a circle, no package
(``turnstile.server``, ``turnstile.viewer``, … each module folded into its package) imports
another in a circle, and the layers of the request's path only look down (the request and the
dialects below the gateways, the gateways below the HTTP edge, the edge below the viewer and
``wiring.py``, which mounts the viewer on the app it composes).

Each check is a function over a graph; the controls run the same functions on a made-up
package written to a temporary directory, so a checker that stopped seeing a violation fails."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
NAME = "turnstile"

# what each layer may not import (a package or module of turnstile, by dotted prefix); every
# key and every banned name must name a real module or package (test_the_layer_table_is_real)
BELOW: dict[str, tuple[str, ...]] = {
    "turnstile.request": (
        "turnstile.dialects",
        "turnstile.gateway",
        "turnstile.server",
        "turnstile.store",
    ),
    "turnstile.errors": ("turnstile.dialects", "turnstile.gateway", "turnstile.server"),
    # a dialect renders the gateway's typed answer (turnstile.answer), never the store's record
    "turnstile.dialects": (
        "turnstile.gateway",
        "turnstile.server",
        "turnstile.engines",
        "turnstile.store",
    ),
    # one room per dialect (issue 41): each reads its body into a Chat body the Chat room's
    # reader checks, and none imports another's room; what all share (base, images) none
    "turnstile.dialects.chat": (
        "turnstile.dialects.responses",
        "turnstile.dialects.messages",
        "turnstile.dialects.gemini",
    ),
    "turnstile.dialects.responses": ("turnstile.dialects.messages", "turnstile.dialects.gemini"),
    "turnstile.dialects.messages": ("turnstile.dialects.responses", "turnstile.dialects.gemini"),
    "turnstile.dialects.gemini": ("turnstile.dialects.responses", "turnstile.dialects.messages"),
    "turnstile.dialects.base": (
        "turnstile.dialects.chat",
        "turnstile.dialects.responses",
        "turnstile.dialects.messages",
        "turnstile.dialects.gemini",
    ),
    "turnstile.dialects.images": (
        "turnstile.dialects.chat",
        "turnstile.dialects.responses",
        "turnstile.dialects.messages",
        "turnstile.dialects.gemini",
    ),
    # the Chat dialect parses its own requests (as strictly as gateway.renders_prompt says)
    "turnstile.gateway": (
        "turnstile.server",
        "turnstile.viewer",
        "turnstile.app",
        "turnstile.dialects",
    ),
    # one room per recording mode (issue 41): neither mode imports the other; both share the
    # door, the policy control and the record at the gateway package's level
    "turnstile.gateway.token_in": ("turnstile.gateway.capture",),
    "turnstile.gateway.capture": ("turnstile.gateway.token_in",),
    # what both modes share imports neither room (the contract names them for mypy only)
    "turnstile.gateway.admission": ("turnstile.gateway.token_in", "turnstile.gateway.capture"),
    "turnstile.gateway.control": ("turnstile.gateway.token_in", "turnstile.gateway.capture"),
    "turnstile.gateway.record": ("turnstile.gateway.token_in", "turnstile.gateway.capture"),
    "turnstile.engines": ("turnstile.gateway", "turnstile.server", "turnstile.dialects"),
    "turnstile.chat": (
        "turnstile.gateway",
        "turnstile.server",
        "turnstile.engines",
        "turnstile.parsing",
    ),
    "turnstile.store": ("turnstile.gateway", "turnstile.server", "turnstile.dialects"),
    # the HTTP edge serves what it is given: the viewer and the app's composition sit above it
    "turnstile.server": ("turnstile.viewer", "turnstile.app"),
    "turnstile.viewer": ("turnstile.app",),
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
    "turnstile.app",
    "turnstile.converters",
    "turnstile.viewer",
    "turnstile.testing",
)
BELOW["turnstile.families"] = TOP
# the per-token arrays' declarations sit below the engines and the store that both use them
BELOW["turnstile.token_arrays"] = (*TOP, "turnstile.families")
# media on a prompt (images: their items, limits, decoding) sits below all that carry them
BELOW["turnstile.media"] = (*TOP, "turnstile.families", "turnstile.token_arrays")
# the answer's types (events, the finished call) sit below the parser, gateways and dialects
BELOW["turnstile.answer"] = (
    *TOP,
    "turnstile.families",
    "turnstile.token_arrays",
    "turnstile.media",
)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package under ``root`` by dotted name (a package by its own)."""
    found = {}
    for path in (root / NAME).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module → the package's modules it imports (``from pkg import mod`` names the module)."""
    found = modules(root)
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in found.items():
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
            edges[name].update(t for t in targets if t in found and t != name)
    return edges


def package_of(module: str) -> str:
    """The package a module belongs to, one level under the root: ``turnstile.server.app`` →
    ``turnstile.server``; a top-level module (``turnstile.auth``) and the root are their own."""
    return ".".join(module.split(".")[:2])


def package_graph(edges: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """The module graph with every module folded into its package (imports within one dropped)."""
    folded: dict[str, set[str]] = defaultdict(set)
    for source, targets in edges.items():
        for target in targets:
            if package_of(source) != package_of(target):
                folded[package_of(source)].add(package_of(target))
    return folded


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm)."""
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


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def upward(edges: Mapping[str, Iterable[str]], below: Mapping[str, Iterable[str]]) -> list[str]:
    """Every import of a layer into one it must stay below, as ``source imports target``."""
    return sorted(
        f"{source} imports {target}"
        for source, targets in edges.items()
        for layer, banned in below.items()
        if _within(source, layer)
        for target in targets
        if any(_within(target, b) for b in banned)
    )


def stale(below: Mapping[str, Iterable[str]], known: Iterable[str]) -> list[str]:
    """The layer table's names (keys and banned alike) that name no module or package: a
    renamed package would otherwise drop its rule without a word."""
    real = set(known)
    return sorted({n for key, banned in below.items() for n in (key, *banned)} - real)


# -- controls: the checks above, run over a made-up package, report what it breaks ----------

_MADE_UP = {
    "__init__.py": "",
    "errors.py": "",
    "wiring.py": "from .server import app\nfrom .viewer import routes\n",
    # a module circle inside one package (one of them function-local, one TYPE_CHECKING)
    "gateway/__init__.py": "",
    "gateway/a.py": "def f():\n    from . import b\n",
    "gateway/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n",
    # an upward import: the gateway reaching up into the HTTP edge
    "gateway/call.py": "from ..server.context import AppContext\n",
    # a package circle without a module circle: server.app → viewer.routes → server.context
    "server/__init__.py": "",
    "server/context.py": "from ..errors import APIError\n",
    "server/app.py": "from ..viewer.routes import ROUTES\n",
    "viewer/__init__.py": "",
    "viewer/routes.py": "import turnstile.server.context\n",
}


@pytest.fixture
def made_up(tmp_path: Path) -> Path:
    for rel, text in _MADE_UP.items():
        path = tmp_path / NAME / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_module_circle_check_reports_a_made_up_circle(made_up: Path):
    assert cycles(import_graph(made_up)) == [["turnstile.gateway.a", "turnstile.gateway.b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_circle_check_reports_a_made_up_circle(made_up: Path):
    graph = import_graph(made_up)
    # no module circle between the two packages: only folding them shows it
    assert ["turnstile.server.app", "turnstile.viewer.routes"] not in cycles(graph)
    assert cycles(package_graph(graph)) == [["turnstile.server", "turnstile.viewer"]]
    # the way out the package takes: the composer (wiring) mounts the viewer, the edge does not
    graph["turnstile.server.app"].discard("turnstile.viewer.routes")
    assert cycles(package_graph(graph)) == []


def test_the_layer_check_reports_a_made_up_upward_import(made_up: Path):
    graph = import_graph(made_up)
    assert upward(graph, BELOW) == [
        "turnstile.gateway.call imports turnstile.server.context",
        "turnstile.server.app imports turnstile.viewer.routes",
    ]


def test_the_stale_key_check_reports_a_renamed_layer(made_up: Path):
    known = modules(made_up)
    table = {"turnstile.gateway": ("turnstile.server",), "turnstile.gateways": ("turnstile.web",)}
    assert stale(table, known) == ["turnstile.gateways", "turnstile.web"]
    assert stale({"turnstile.server": ("turnstile.viewer.routes",)}, known) == []


# -- the package itself --------------------------------------------------------------------


@functools.cache
def _graph() -> dict[str, set[str]]:
    """The package's own graph, read once for the checks below (none of them changes it)."""
    return import_graph()


def test_no_module_imports_another_in_a_circle():
    assert cycles(_graph()) == []


def test_no_package_imports_another_in_a_circle():
    """``turnstile.server`` does not import ``turnstile.viewer``: ``wiring.py`` mounts the
    viewer's routes on the app it composes, and the viewer imports the edge below it."""
    assert cycles(package_graph(_graph())) == []


def test_the_layer_table_is_real():
    assert stale(BELOW, modules()) == []


def test_the_layers_only_import_down():
    assert upward(_graph(), BELOW) == []


def test_testing_is_a_top_layer_nothing_imports():
    """``turnstile.testing`` (the fakes, the relay) serves the tests and benchmarks: no module
    of the package outside it imports it, so a fake never reaches a request's path."""
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in _graph().items()
        if not _within(source, "turnstile.testing")
        for target in targets
        if _within(target, "turnstile.testing")
    )
    assert wrong == []


def test_the_server_is_the_http_edge_only():
    """``server/`` holds the HTTP edge: no gateway (a call's lifecycle) and no dialect lives
    there, and the gateways and dialects never reach up into it."""
    names = {p.stem for p in (ROOT / NAME / "server").glob("*.py")}
    assert not names & {"gateway", "passthrough", "requests", "chat_completions", "record"}
