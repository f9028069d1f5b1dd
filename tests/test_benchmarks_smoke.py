"""Each benchmark script runs end to end in its --quick mode, exactly as benchmarks/README.md
says (the venv's Python, from the repository root, a fresh environment: nothing of pytest's
import path), prints its table, checks its records against what its fake engine received
and sampled, and fails (exits non-zero) when a call fails or a record is wrong.

No timing is asserted here: timings belong in the benchmarks' own output (see
benchmarks/README.md)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
# the script -> a line of its --quick output
SCRIPTS = {
    "agent_sessions.py": "later calls extended the recorded tokens",
    "overhead.py": "x fastest relay",
    "long_session.py": "Turnstile / relay",
    "memory.py": "bytes / recorded token",
    "end_to_end.py": "Turnstile / direct wall time",
    "soak.py": "RSS after close",
    "ray_scale.py": "1 vs 2 replicas, through Serve's proxy and direct, vs one process",
    "profile_call.py": "Turnstile CPU per call",
    "store_backends.py": "gateway+database pg/sqlite",
    "group_commit.py": "group / per call: CPU",
    "routed_experts_cost.py": "arrays / uint8 routing size",
}
# the load benchmarks: their records checked against the fake engine's own recorder
CHECKED = {
    "agent_sessions.py",
    "overhead.py",
    "long_session.py",
    "ray_scale.py",
    "profile_call.py",
    "store_backends.py",
}
CHECK_LINE = "records checked against the engine's own account: "
# another engineer's scripts, with a smoke test of their own
NOT_HERE = {"train_proof.py", "policy_gguf.py"}


def venv_python() -> Path:
    """The Python the README names: ``~/.cache/turnstile/venv/bin/python`` (``$TURNSTILE_CACHE``
    moves the cache, as ``./run`` does)."""
    cache = Path(os.environ.get("TURNSTILE_CACHE", Path.home() / ".cache" / "turnstile"))
    return cache / "venv" / "bin" / "python"


def fresh_env() -> dict[str, str]:
    """A fresh shell's environment: no ``$PYTHONPATH`` (the README's line has none), so a
    script importing ``tests.*`` or ``benchmarks.*`` fails here as it would for a user. Only
    where the shared venv's editable install names another checkout do ``turnstile`` and
    ``turnstile_testbed`` (the packages alone, not this checkout's root) come first, so this
    checkout's code is run."""
    env = {
        k: os.environ[k]
        for k in ("PATH", "HOME", "TMPDIR", "TURNSTILE_CACHE", "LANG")
        if k in os.environ
    }
    found = subprocess.run(
        [str(venv_python()), "-c", "import turnstile; print(turnstile.__file__)"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if Path(found).resolve().parent != (ROOT / "turnstile").resolve():
        only = Path(tempfile.mkdtemp(prefix="turnstile-pkg-"))
        (only / "turnstile").symlink_to(ROOT / "turnstile")
        (only / "turnstile_testbed").symlink_to(ROOT / "testbed" / "turnstile_testbed")
        env["PYTHONPATH"] = str(only)
    return env


def readme_run(script: str, *args: str, timeout: float = 230) -> subprocess.CompletedProcess:
    """``~/.cache/turnstile/venv/bin/python benchmarks/<script> ARGS`` from the repository
    root, as the README says."""
    return subprocess.run(
        [str(venv_python()), f"benchmarks/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=fresh_env(),
    )


def quick(script: str, *args: str) -> subprocess.CompletedProcess:
    """``benchmarks/<script> --quick ARGS``, which must exit 0."""
    r = readme_run(script, "--quick", *args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def checked_counts(stdout: str) -> list[int]:
    """The numbers on the line where a script says how many records it checked."""
    (line,) = [x for x in stdout.splitlines() if x.startswith(CHECK_LINE)]
    return [int(n) for n in re.findall(r"\d+", line.removeprefix(CHECK_LINE))]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_benchmark_quick(script: str) -> None:
    r = quick(script)
    assert SCRIPTS[script] in r.stdout, r.stdout[-3000:]
    if script in CHECKED:
        counts = checked_counts(r.stdout)
        assert counts and all(n > 0 for n in counts), r.stdout[-3000:]


def test_readme_names_each_run() -> None:
    """The README's line for each script is the one these tests run."""
    readme = (BENCH / "README.md").read_text()
    for script in SCRIPTS:
        assert f"~/.cache/turnstile/venv/bin/python benchmarks/{script} --quick" in readme, script


def test_routed_experts_cost_stores_the_rows_it_times() -> None:
    """The routing arm must record every token's rows (384 bytes each at the uint8 size) and
    the off arm none: a ratio of routing timed but not stored would measure nothing."""
    r = quick("routed_experts_cost.py")
    rows = {
        cells[0]: float(cells[-1])
        for line in r.stdout.splitlines()
        if line.startswith("| o")
        and len(cells := [c.strip() for c in line.strip("|").split("|")]) == 5
    }
    assert rows.keys() == {"off", "on"}, r.stdout[-3000:]
    assert rows["off"] == 0.0 and 0.999 <= rows["on"] <= 1.01, rows


def test_routed_experts_cost_prototype_and_floor_store_every_row() -> None:
    """The segment prototype stores every row too (outside SQLite: its calls' ``arrays_at``),
    and the floor rewrites real rows: with their arrays each commit costs more than without."""
    r = quick("routed_experts_cost.py", "--arms", "off,on,segment", "--contexts", "4000", "--floor")
    rows = {
        cells[0]: float(cells[-1])
        for line in r.stdout.splitlines()
        if line.startswith(("| o", "| s"))
        and len(cells := [c.strip() for c in line.strip("|").split("|")]) == 5
    }
    assert rows.keys() == {"off", "on", "segment"}, r.stdout[-3000:]
    assert 0.999 <= rows["segment"] <= 1.01, rows
    floor = r.stdout.split("The storage's floor", 1)[1].splitlines()[-1]
    without, with_, extra = (float(c.strip().strip("+")) for c in floor.strip("|").split("|")[:3])
    assert with_ > without and extra > 0, floor


def test_overhead_counts_every_call() -> None:
    """overhead.py's check pass sends one call per agent per mode through each recording
    target, and the engine must have received exactly that many: 2 agents x 2 modes x 2
    targets here."""
    r = quick("overhead.py", "--modes", "plain,stream", "--targets", "floor,turnstile")
    assert checked_counts(r.stdout) == [4, 4], r.stdout[-3000:]


@pytest.mark.timeout(240)
def test_overhead_fails_when_calls_fail() -> None:
    """The control: the engine stops after the warm-up, every measured call fails, and the
    script must exit non-zero (it once counted the errors and exited 0)."""
    r = readme_run(
        "overhead.py", "--quick", "--modes", "plain", "--targets", "turnstile", "--stop-engine"
    )
    assert r.returncode != 0, r.stdout[-3000:]
    assert "FAILED:" in r.stdout and "calls failed" in r.stdout, r.stdout[-3000:]


@pytest.mark.timeout(240)
def test_overhead_fails_on_a_wrong_record() -> None:
    """The control: one checked call's logprobs zeroed in Turnstile's store; the check against
    the engine's account must find it and the script exit non-zero."""
    r = readme_run(
        "overhead.py", "--quick", "--modes", "plain", "--targets", "turnstile", "--corrupt-record"
    )
    assert r.returncode != 0, r.stdout[-3000:]
    assert "FAILED:" in r.stdout and "the engine returned -0.05" in r.stdout, r.stdout[-3000:]


@pytest.mark.timeout(240)
def test_agent_sessions_fails_on_wrong_records() -> None:
    """The control: Turnstile's recorded logprobs zeroed before the check; the sampled
    requests of the fake engine no longer match and the script exits non-zero."""
    r = readme_run(
        "agent_sessions.py",
        *("--quick", "--modes", "paced", "--deep", "0", "--flat", "0", "--corrupt-record"),
    )
    assert r.returncode != 0, r.stdout[-3000:]
    assert "is not what the engine sampled" in r.stdout, r.stdout[-3000:]


@pytest.mark.timeout(240)
def test_profile_call_fails_on_a_wrong_record() -> None:
    """The control for profile_call.py (and the check it shares with long_session.py and
    ray_scale.py): a corrupted record exits non-zero."""
    r = readme_run("profile_call.py", "--quick", "--corrupt-record")
    assert r.returncode != 0, r.stdout[-3000:]
    assert "the engine returned" in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.timeout(240)
def test_long_session_fails_on_a_wrong_record() -> None:
    """The control for long_session.py: the session's recorded logprobs zeroed before the
    check; the script must exit non-zero."""
    r = readme_run("long_session.py", "--quick", "--corrupt-record")
    assert r.returncode != 0, r.stdout[-3000:]
    assert "the engine returned" in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.timeout(240)
def test_agent_sessions_workers_quick() -> None:
    """agent_sessions.py with ``turnstile serve --workers 2`` as a third target: its sessions
    at their base URLs, every later call extending its recorded tokens."""
    r = quick(
        "agent_sessions.py",
        *("--workers", "2", "--modes", "paced", "--conc", "4", "--deep", "0", "--flat", "0"),
    )
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("chained (2 workers)")]
    done, later = line.split(": ")[1].split(" ")[0].split("/")
    assert done == later and int(later) > 0, line
    assert "| 2 workers |" in r.stdout, r.stdout[-3000:]


@pytest.mark.timeout(240)
def test_peers_quick() -> None:
    """peers.py with the targets that need only the project venv (the peers' own venvs come
    from benchmarks/setup_peer_venvs.sh): the engine's drifting reply and the exactness check."""
    r = quick("peers.py", "--targets", "relay,turnstile")
    assert "record completion = sampled" in r.stdout, r.stdout[-3000:]
    # Turnstile's records equal what the engine received and sampled, and every turn's prompt
    # carries the previous turn's sampled IDs (4 calls, 3 continuations, per mode).
    rows = [x for x in r.stdout.splitlines() if x.startswith("| turnstile ")]
    exact = [x for x in rows if "/3 " in x]
    assert len(exact) == 2 and all("4/4" in x and "3/3" in x for x in exact), r.stdout[-3000:]


def bench_imports(path: Path) -> list[str]:
    """What a benchmark script takes from outside the package's public names: an import of
    ``tests``/``benchmarks`` (they are not on a user's path) or of a ``_private`` name of
    ``turnstile`` or of the test bed (``turnstile_testbed``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
            names: list[str] = []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods, names = [node.module], [a.name for a in node.names]
        else:
            continue
        for mod in mods:
            top = mod.split(".")[0]
            if top in ("tests", "benchmarks", "trainers"):
                out.append(f"{path.name}:{node.lineno} imports {mod}")
            public = top in ("turnstile", "turnstile_testbed")
            if public and any(p.startswith("_") for p in mod.split(".")[1:]):
                out.append(f"{path.name}:{node.lineno} imports {mod}")
            if public:
                out += [
                    f"{path.name}:{node.lineno} imports {n}" for n in names if n.startswith("_")
                ]
    return out


def test_benchmarks_import_no_test_code_or_private_names() -> None:
    found = [
        x for p in sorted(BENCH.glob("*.py")) if p.name not in NOT_HERE for x in bench_imports(p)
    ]
    assert not found, found


def test_the_import_rule_can_fail(tmp_path: Path) -> None:
    """The rule's control: the imports it exists to catch."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from tests.trainers import venv\nimport benchmarks.policy_gguf\n"
        "from turnstile_testbed.demo import _serve\nfrom turnstile.chat._x import y\n"
    )
    assert len(bench_imports(bad)) == 4
