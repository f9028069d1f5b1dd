"""The unit tier's rule is enforced by what a test starts (``tests/conftest.py``'s
``UnitGuard``), not by its fixtures' names: a real pytest run, in a child process, of unit
tests that listen on a socket or start a program must fail, even when the code catches what
the guard raises; ruff, a socket bound but not listening, and an integration test that
listens must pass. The positive controls show the same run sees what passes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CHILD_TESTS = """
import multiprocessing
import socket
import subprocess
import sys

import pytest


def _listen():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    s.close()


@pytest.mark.unit
def test_unit_listens():
    _listen()


@pytest.mark.unit
def test_unit_listens_and_swallows_it():
    try:
        _listen()
    except BaseException:
        pass


@pytest.fixture
def server():
    _listen()
    yield


@pytest.mark.unit
def test_unit_fixture_by_another_name_listens(server):
    pass


@pytest.mark.unit
def test_unit_runs_a_program():
    subprocess.run(["true"], check=True)


@pytest.mark.unit
def test_unit_spawns_a_python():
    p = multiprocessing.get_context("spawn").Process(target=print)
    p.start()
    p.join()


@pytest.mark.unit
def test_unit_runs_ruff():
    subprocess.run([sys.executable, "-m", "ruff", "--version"], check=True)


@pytest.mark.unit
def test_unit_binds_without_listening():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.close()


@pytest.mark.integration
def test_integration_listens():
    _listen()
"""

FAILS = {
    "test_unit_listens",
    "test_unit_listens_and_swallows_it",
    "test_unit_fixture_by_another_name_listens",
    "test_unit_runs_a_program",
    "test_unit_spawns_a_python",
}
PASSES = {"test_unit_runs_ruff", "test_unit_binds_without_listening", "test_integration_listens"}


def test_the_guard_fails_a_unit_test_that_starts_a_server_or_a_program(tmp_path: Path):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_child.py").write_text(CHILD_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    junit = tmp_path / "junit.xml"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
        + ["-c", str(tmp_path / "pytest.ini"), f"--junitxml={junit}", "test_child.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert junit.exists(), r.stdout + r.stderr
    outcome: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        bad = case.find("failure") is not None or case.find("error") is not None
        outcome[case.get("name", "")] = "failed" if bad else "passed"
    assert outcome == {**dict.fromkeys(FAILS, "failed"), **dict.fromkeys(PASSES, "passed")}, (
        r.stdout[-4000:]
    )
    assert "unit tier" in r.stdout or "a unit test" in r.stdout, r.stdout[-4000:]
