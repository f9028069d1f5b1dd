"""Which of the package's rooms may import which (issue 41), read from the source with ``ast``
(function-local imports counted, relative ones resolved): the record store imports nothing of
the server's authentication (``turnstile/auth.py``: the capability it mints with a session
comes from ``random_ids``, at the bottom), and nothing outside the composition root
(``turnstile/app/``: the CLI, serve's options, the wiring, the workers, Ray's replicas) imports
it but ``python -m turnstile`` (``turnstile/__main__.py``). The controls run the same scan on
a made-up package so a scan that stopped seeing an import fails."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def imported(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file imports, absolute (``from x import y`` gives ``x`` and ``x.y``: ``y``
    may be a module)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts if parts[-1] == "__init__" else parts[:-1]
    package = [p for p in package if p != "__init__"]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def importers(package: str, banned: str, root: Path = ROOT) -> list[str]:
    """Files under ``package`` (a folder of ``root``) that import ``banned`` or below it."""
    files = sorted((root / package.replace(".", "/")).rglob("*.py"))
    assert files, package
    return [
        f"{f.relative_to(root)} imports {m}"
        for f in files
        for m in sorted(imported(f, root))
        if m == banned or m.startswith(banned + ".")
    ]


def test_the_store_imports_nothing_of_auth():
    assert not importers("turnstile.store", "turnstile.auth")


def test_nothing_below_imports_the_composition_root():
    app = ROOT / "turnstile" / "app"
    assert {"cli.py", "serve_options.py", "wiring.py", "workers.py"} <= {
        p.name for p in app.glob("*.py")
    }
    files = [
        f
        for f in sorted((ROOT / "turnstile").rglob("*.py"))
        if app not in f.parents and f.name != "__main__.py"
    ]
    found = [
        f"{f.relative_to(ROOT)} imports {m}"
        for f in files
        for m in sorted(imported(f))
        if m == "turnstile.app" or m.startswith("turnstile.app.")
    ]
    assert not found, found


def test_the_scan_sees_relative_and_local_imports(tmp_path: Path):
    store = tmp_path / "turnstile" / "store"
    store.mkdir(parents=True)
    (tmp_path / "turnstile" / "__init__.py").write_text("")
    (store / "__init__.py").write_text("from ..auth import new_capability\n")
    (store / "a.py").write_text("def f():\n    from .. import auth\n")
    (store / "b.py").write_text("import turnstile.auth\nfrom ..authx import y\n")
    found = importers("turnstile.store", "turnstile.auth", tmp_path)
    assert sorted({x.split(" imports ")[0] for x in found}) == [
        "turnstile/store/__init__.py",
        "turnstile/store/a.py",
        "turnstile/store/b.py",
    ], found
