"""The test bed stays out of the runtime package (issue 46): no module of ``turnstile/`` imports
``turnstile_testbed`` (function-local imports counted), so an installed wheel, which does not
hold the test bed, never needs it. The heavy check of the built wheel itself is
``tests/test_wheel.py``; this one runs in the fast tier, and its control runs the same scan on
a made-up module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
BED = "turnstile_testbed"


def bed_imports(path: Path) -> list[str]:
    """Where a file imports the test bed: ``import turnstile_testbed[.x]`` or ``from
    turnstile_testbed[.x] import …``, at any depth of the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module]
        else:
            continue
        out += [f"{path}:{node.lineno} {m}" for m in mods if m.split(".")[0] == BED]
    return out


def test_the_package_imports_nothing_of_the_test_bed():
    files = sorted((ROOT / "turnstile").rglob("*.py"))
    assert len(files) > 100, len(files)
    found = [x for f in files for x in bed_imports(f)]
    assert not found, found


def test_the_test_bed_is_not_inside_the_package():
    bed = {p.stem for p in (ROOT / "testbed" / BED).glob("*.py")} - {"__init__", "__main__"}
    assert {"vllm", "sglang", "provision", "demo", "postgres"} <= bed, bed
    inside = [p for p in (ROOT / "turnstile").rglob("*.py") if p.stem.startswith("testbed")]
    assert not inside, inside


def test_the_scan_finds_a_made_up_import(tmp_path: Path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import turnstile_testbed as testbed\n"
        "def f():\n    from turnstile_testbed.vllm import vllm_python\n"
        "from turnstile.testing import ports\nimport turnstile_testbedx\n"
    )
    assert len(bed_imports(bad)) == 2, bed_imports(bad)
