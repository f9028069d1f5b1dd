"""The one builder of the test beds' pinned venvs (vLLM's, SGLang's): built once, reused while
its pins are the same, rebuilt when they change, and a failing step is a clear error with the
log's tail. Checked on a small venv in a scratch cache (the real ones take minutes); the truth
is the venv's own Python and what the steps left in it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from turnstile_testbed.venv import pinned_venv

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PYTHON = Path(sys.executable).name if Path(sys.executable).name.startswith("python3") else "python3"


def _marker(text: str):  # noqa: ANN202
    """Steps writing ``text`` into a file of the venv with its own Python."""

    def steps(python: Path) -> list[list[str]]:
        out = python.parent.parent / "marker.txt"
        return [[str(python), "-c", f"open({str(out)!r}, 'w').write({text!r})"]]

    return steps


def test_a_venv_is_built_once_and_rebuilt_when_its_pins_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNSTILE_CACHE", str(tmp_path))
    root = pinned_venv("bed-venv", PYTHON, ["a==1"], _marker("first"), "a test bed")
    python = root / "bin" / "python"
    ran = subprocess.run([str(python), "-c", "import sys; print(sys.prefix)"], capture_output=True)
    assert Path(ran.stdout.decode().strip()).resolve() == root.resolve()
    assert (root / "marker.txt").read_text() == "first"
    # the same pins: nothing runs again
    assert pinned_venv("bed-venv", PYTHON, ["a==1"], _marker("second"), "a test bed") == root
    assert (root / "marker.txt").read_text() == "first"
    # new pins: a new venv from scratch, with an after-step
    seen: list[Path] = []
    pinned_venv("bed-venv", PYTHON, ["a==2"], _marker("third"), "a test bed", after=seen.append)
    assert (root / "marker.txt").read_text() == "third" and seen == [root]
    assert (root / ".installed").read_text() == "a==2"
    assert "$ " in (tmp_path / "bed-venv.log").read_text()  # every command logged


def test_a_failing_step_is_an_error_naming_the_log_and_leaves_no_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNSTILE_CACHE", str(tmp_path))

    def failing(python: Path) -> list[list[str]]:
        return [[str(python), "-c", "import sys; print('no wheel for this'); sys.exit(3)"]]

    with pytest.raises(RuntimeError) as err:
        pinned_venv("bad-venv", PYTHON, ["b==1"], failing, "a broken bed")
    assert "installing a broken bed failed" in str(err.value)
    assert "no wheel for this" in str(err.value) and "bad-venv.log" in str(err.value)
    assert not (tmp_path / "bad-venv" / ".installed").exists()


def test_a_missing_python_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNSTILE_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match="needs python9.99"):
        pinned_venv("x-venv", "python9.99", ["c==1"], _marker("x"), "a bed")
