"""The package type-checks: mypy (configured in pyproject.toml, ``[tool.mypy]``) over
``turnstile/`` finds nothing. That is where the engine, gateway and record contracts
(``engines.base``, ``server.contract``, ``store.records``) are held to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors():
    pytest.importorskip("mypy")
    # mypy's incremental cache (.mypy_cache, ignored by git) makes a rerun take seconds
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, f"mypy failed:\n{r.stdout}\n{r.stderr}"
