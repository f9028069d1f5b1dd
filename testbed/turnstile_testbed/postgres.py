"""A real PostgreSQL server from Debian's packages, started by the test suite in a temporary
directory (installed with apt-get when missing), for the PostgreSQL record store.

PostgreSQL refuses to run as root: when the suite runs as root, the cluster belongs to the
``postgres`` account the Debian package creates. ``fsync`` stays on: the store's durability
promise is tested against the real thing.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

import turnstile_testbed as testbed


def _bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        apt = shutil.which("apt-get")
        if apt is None:
            raise RuntimeError("the PostgreSQL store tests need Debian's postgresql package")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run([apt, "update", "-qq"], check=True, env=env)
        subprocess.run(
            [apt, "install", "-y", "-qq", "--no-install-recommends", "postgresql"],
            check=True,
            env=env,
        )
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent


class PostgresServer:
    """One cluster on a free loopback port; :meth:`database` makes a fresh database."""

    def __init__(self) -> None:
        self.bin = _bin()
        # its own directory under /tmp: the postgres account must reach it (pytest's are 0700)
        self.root = Path(tempfile.mkdtemp(prefix="turnstile-pg-"))
        self.data = self.root / "cluster"
        self.port = testbed.free_port()
        self.log = self.root / "postgres.log"
        self.proc: subprocess.Popen | None = None
        self.user: str | None = "postgres" if os.geteuid() == 0 else None

    def _owner(self) -> dict:
        """Popen's arguments that run a command as the cluster's owner."""
        if self.user is None:
            return {}
        pw = pwd.getpwnam(self.user)
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def start(self) -> PostgresServer:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.user:
            pw = pwd.getpwnam(self.user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        if not self.data.exists():
            subprocess.run(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "turnstile",
                    "--auth=trust",
                    "--no-sync",
                    "-E",
                    "UTF8",
                ],
                check=True,
                capture_output=True,
                **self._owner(),
            )
        log = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "max_connections=200",
                "-c",
                "fsync=on",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            **self._owner(),
        )
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return self
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not start: see {self.log}") from None
                time.sleep(0.2)

    def url(self, db: str) -> str:
        return f"postgresql://turnstile@127.0.0.1:{self.port}/{db}"

    def database(self) -> str:
        """A new empty database's URL."""
        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self, sig: int = signal.SIGINT) -> None:
        """SIGINT: fast shutdown; SIGKILL: the database's machine dies (crash recovery)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
