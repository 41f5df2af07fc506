"""A real PostgreSQL server for the tests: one per test session, in a temporary folder, on a free loopback port.

It is Debian's `postgresql` package (`apt-get install postgresql`, as the README's test command and .ci/run do);
its binaries are found on PATH or under /usr/lib/postgresql/<version>/bin. PostgreSQL refuses to run as root, so
as root it runs as the `postgres` user the package creates. Each test gets a database of its own.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

USER = "harmony"


def _bindir() -> Path:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda path: int(path.split("/")[4]))
    if not versions:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (see the README's test command)")
    return Path(versions[-1]).parent


class PostgresServer:
    def __init__(self) -> None:
        self._bin = _bindir()
        self.folder = Path(tempfile.mkdtemp(prefix="harmony-proxy-pg-"))
        self._data, self._log = self.folder / "data", self.folder / "server.log"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._as: list[str] = []
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(self.folder, account.pw_uid, account.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self._data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")

    def _run(self, program: str, *arguments: str) -> None:
        done = subprocess.run([*self._as, str(self._bin / program), *arguments], capture_output=True, text=True,
                              cwd=self.folder, timeout=120, check=False)
        if done.returncode != 0:
            log = self._log.read_text() if self._log.exists() else ""
            raise RuntimeError(f"{program} failed: {done.stdout}{done.stderr}{log}")

    def start(self) -> None:
        # No fsync: the tests kill proxies, never the machine, and a commit is durable against the first without it.
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c max_connections=200"
                   " -c fsync=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self._data), "-l", str(self._log), "-o", options, "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self._data), "-m", "fast", "-w", "stop")

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The whole server stopped (SIGSTOP to the postmaster and its backends) until the block ends: connections
        stay open and statements wait, as when the database's host stalls."""
        postmaster = int((self._data / "postmaster.pid").read_text().split()[0])
        processes = [postmaster, *_children(postmaster)]
        for pid in processes:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in processes:
                os.kill(pid, signal.SIGCONT)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """The URL of a new, empty database."""
        name = "test_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def remove(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def _children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    yield server
    server.remove()


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """A database of this test's own."""
    return postgres.new_database()
