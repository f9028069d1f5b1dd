"""The release canary (issue 45): the newest release of each coding CLI and agent SDK in
``turnstile_testbed.NODE_HARNESSES``, installed from the npm registry into a scratch folder
(never the pinned test bed's cache), and of each official Python SDK (``PY_SDKS``: openai,
anthropic, google-genai), installed with pip into a scratch venv there (never the project's
venv), run through the same scenarios as the suite (tests/test_coding_agents.py,
tests/test_gemini_cli.py, tests/test_python_sdks.py), and a table of what each sent that
Turnstile now refuses or warns about, and the warnings a Python SDK raised. Run by hand before
a release, not in the suite:

    ~/.cache/turnstile/venv/bin/python benchmarks/release_canary.py [--keep DIR] [-k EXPR]

It prints a Markdown table (paste it into docs/harnesses/index.md, "Last canary run"): per
scenario, the versions run, the outcome, the calls and their segment reasons, the warnings
the records carry, and for a failure its first lines (a refusal names the field).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from turnstile_testbed import NODE_HARNESSES  # noqa: E402

MODULES = ("tests/test_coding_agents.py", "tests/test_gemini_cli.py", "tests/test_python_sdks.py")
PY_SDKS = ("openai", "anthropic", "google-genai")


def python_sdks(folder: Path) -> tuple[Path, dict[str, str]]:
    """A scratch venv in ``folder`` with the newest release of each of ``PY_SDKS`` (pip's
    own resolution); its python, and the version each got."""
    venv = folder / "py"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--upgrade", "--disable-pip-version-check"]
    subprocess.run([*pip, *PY_SDKS], check=True)
    out = {}
    for name in PY_SDKS:
        read = f"import importlib.metadata as m; print(m.version({name!r}))"
        got = subprocess.run([str(python), "-c", read], capture_output=True, text=True)
        out[name] = got.stdout.strip() or "-"
    return python, out


def pinned_sdks() -> dict[str, str]:
    """The project venv's versions of ``PY_SDKS`` (what the suite runs)."""
    import importlib.metadata as m

    out = {}
    for name in PY_SDKS:
        try:
            out[name] = m.version(name)
        except m.PackageNotFoundError:
            out[name] = "-"
    return out


def versions(folder: Path) -> dict[str, str]:
    """What npm installed for each package (its own package.json)."""
    out = {}
    for name in NODE_HARNESSES:
        manifest = folder / "node_modules" / name / "package.json"
        out[name] = json.loads(manifest.read_text())["version"] if manifest.exists() else "-"
    return out


def run_suite(folder: Path, python: Path, select: str | None) -> Path:
    """The scenarios under pytest with ``TURNSTILE_NODE_LATEST`` and ``TURNSTILE_SDK_PYTHON``
    set; a JUnit file holding each test's outcome and its ``HARNESS`` and ``SDK-WARNINGS``
    lines (stdout)."""
    junit = folder / "canary.xml"
    cmd = [sys.executable, "-m", "pytest", *MODULES, "-q", "-p", "no:cacheprovider"]
    cmd += ["--junitxml", str(junit), "-o", "junit_logging=system-out", "-m", "heavy"]
    if select:
        cmd += ["-k", select]
    env = {**os.environ, "TURNSTILE_NODE_LATEST": str(folder), "TURNSTILE_SDK_PYTHON": str(python)}
    with (folder / "pytest.log").open("w") as log:  # the table alone on stdout
        subprocess.run(cmd, cwd=ROOT, env=env, check=False, stdout=log, stderr=subprocess.STDOUT)
    return junit


def rows(junit: Path) -> list[dict]:
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        harness: dict = {}
        sdk: list[str] = []
        for line in (case.findtext("system-out") or "").splitlines():
            if line.startswith("HARNESS "):
                harness = json.loads(line[len("HARNESS ") :])
            elif line.startswith("SDK-WARNINGS "):
                sdk = json.loads(line[len("SDK-WARNINGS ") :])
        if sdk:
            harness["warnings"] = [*harness.get("warnings", []), *sdk]
        why = ""
        if failed is not None:
            why = " ".join((failed.get("message") or failed.text or "").split())[:240]
        elif skipped is not None:
            why = " ".join((skipped.get("message") or "").split())[:240]
        outcome = "failed" if failed is not None else "skipped" if skipped is not None else "ok"
        out.append({"test": case.get("name", ""), "outcome": outcome, "why": why, **harness})
    return out


def table(found: dict[str, str], sdks: dict[str, str], results: list[dict]) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"Run {when}; newest releases installed:", ""]
    lines += [
        f"- `{k}` {v}" + (" (pinned)" if v == NODE_HARNESSES[k] else "") for k, v in found.items()
    ]
    pins = pinned_sdks()
    lines += [
        f"- `{k}` (PyPI) {v}" + (" (the venv's)" if v == pins[k] else f" (the venv has {pins[k]})")
        for k, v in sdks.items()
    ]
    lines += ["", "| scenario | outcome | calls (chained) | new segments | warnings / refusal |"]
    lines += ["|---|---|---|---|---|"]
    for r in results:
        segs = ", ".join(f"{k} {v}" for k, v in (r.get("new_segments") or {}).items())
        calls = f"{r['calls']} ({r['chained']})" if "calls" in r else "-"
        said = "; ".join(r.get("warnings") or []) or r["why"] or "none"
        lines.append(f"| {r['test']} | {r['outcome']} | {calls} | {segs or '-'} | {said} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="the scratch folder (kept); default: a temp one")
    ap.add_argument("-k", dest="select", help="only the scenarios pytest -k selects")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="turnstile-canary-") as tmp:
        folder = (args.keep or Path(tmp)).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        python, sdks = python_sdks(folder)
        junit = run_suite(folder, python, args.select)
        print(table(versions(folder), sdks, rows(junit)))


if __name__ == "__main__":
    main()
