"""The machine and its processes, for the benchmarks: what it is (cores, load), CPU time per
process from /proc, pinning to a core, and servers started as child processes (pinned with
``taskset``) and stopped by their own pid."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("TURNSTILE_CACHE", Path.home() / ".cache" / "turnstile"))


def bench_venv() -> Path:
    return Path(os.environ.get("TURNSTILE_BENCH_VENV", cache_dir() / "bench-venv"))


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return (
        f"{platform.node()}: {os.cpu_count()} cores ({cpu}), Linux {platform.release()}, "
        f"Python {platform.python_version()}, load average {load[0]:.2f} at start"
    )


def cpu_seconds(pid: int) -> float:
    """CPU time of a process, all its threads: utime + stime from /proc/<pid>/stat (clock
    ticks) refined with the nanosecond per-thread ``schedstat`` counters when the kernel has
    them (a tick is 10 ms, too coarse for short cells)."""
    total = 0
    ok = True
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ok = False
    if ok and total > 0:
        return total / 1e9
    return stat_cpu_seconds(pid)


def stat_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(cpu: int | None) -> None:
    """Pin this process to one core (when the machine has more than one)."""
    if cpu is not None and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {cpu})


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(0.1)
    raise TimeoutError(f"{url} not up after {timeout}s")


def free_port() -> int:
    from turnstile_testbed import free_port as fp

    return fp()


class Server:
    """A server process pinned to a core; stopped (by its own pid) on exit."""

    def __init__(
        self,
        cmd: list[str],
        health: str,
        cpu: int | None,
        log: Path,
        env: dict | None = None,
        timeout: float = 120.0,
    ):
        if cpu is not None and (os.cpu_count() or 1) > 1 and shutil.which("taskset"):
            cmd = ["taskset", "-c", str(cpu), *cmd]
        out = log.open("ab")
        self.proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})},
        )
        out.close()
        self.log = log
        try:
            wait_http(health, self.proc, timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def cpu_pair(self) -> tuple[float, float]:
        """(per-thread ns counters, /proc/<pid>/stat ticks): the first is precise but loses
        threads that exit; the second keeps them (10 ms ticks)."""
        return cpu_seconds(self.proc.pid), stat_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def workdir(name: str, keep: bool = False) -> Iterator[Path]:
    import tempfile

    d = Path(tempfile.mkdtemp(prefix=f"turnstile-bench-{name}-"))
    try:
        yield d
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)
