"""The package type-checks and the tree is linted and formatted: mypy (configured in
pyproject.toml, ``[tool.mypy]``) over ``turnstile/`` and the test bed (``testbed/``) finds
nothing (that is where the engine, gateway and record contracts, ``engines.base``,
``gateway.contract``, ``store.records``, are held to); ruff's linter and formatter find nothing
to change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import turnstile_testbed as testbed

pytestmark = [pytest.mark.unit, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors():
    import mypy  # noqa: F401  pinned (requirements.lock): a broken install fails, not skips

    # mypy's incremental cache, kept beside the test bed (outside the checkout, so a fresh
    # clone on a machine that ran the suite before rechecks only what changed: ~1 min -> s)
    cache = testbed.cache_dir() / "mypy-cache"
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, f"mypy failed:\n{r.stdout}\n{r.stderr}"


# every Python file of the repo
TREES = ("turnstile", "testbed", "tests", "benchmarks", "docs", "examples")


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff_lints_and_formats_the_tree(command):
    """One formatter (ruff format, configured in pyproject.toml) and one linter, over every
    Python file of the repository: a change that is not formatted does not land."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            *command,
            "turnstile",
            "testbed",
            "tests",
            "benchmarks",
            "docs",
            "examples",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, f"ruff {' '.join(command)}:\n{r.stdout}\n{r.stderr}"
