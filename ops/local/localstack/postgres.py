"""PostgreSQL from Debian, run as the postgres user (pg_ctl daemonises by itself)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from localstack import hosts
from localstack.config import PG_PORT, STACK, run, wait_for
from localstack.installs import pg_bin
from localstack.proc import Proc


def pg_run(*cmd: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return run(["runuser", "-u", "postgres", "--", *cmd], **kw)


class Postgres(Proc):
    """pg_ctl daemonises by itself; its pid file is the postmaster's."""

    def __init__(self) -> None:
        super().__init__("postgres", argv=lambda: [], healthy=self._ready, timeout=60)

    @property
    def data(self) -> Path:
        return STACK / "postgres"

    def pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError, IndexError):
            return None

    def _ready(self) -> bool:
        return (
            subprocess.run(
                [str(pg_bin() / "pg_isready"), "-h", "127.0.0.1", "-p", str(PG_PORT), "-q"]
            ).returncode
            == 0
        )

    def start(self) -> bool:
        if self.pid() is not None:
            return False
        STACK.mkdir(parents=True, exist_ok=True)
        STACK.chmod(0o755)
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        if not (self.data / "PG_VERSION").exists():
            self.data.mkdir(parents=True, exist_ok=True)
            shutil.chown(self.data, "postgres", "postgres")
            pg_run(
                str(pg_bin() / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                stdout=subprocess.DEVNULL,
            )
        self.logfile.touch()
        shutil.chown(self.logfile, "postgres", "postgres")
        listen = "127.0.0.1"
        allow_hosts_network(self.data / "pg_hba.conf", str(hosts.subnet()) if hosts.configured() else None)
        if hosts.configured():
            listen += f",{hosts.gateway()}"
        # Loopback (and the hosts' network with --hosts); fsync stays on (durability is what
        # the tests check).
        pg_run(
            str(pg_bin() / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.logfile),
            "-w",
            "-t",
            "60",
            "-o",
            f"-c listen_addresses={listen} -p {PG_PORT} -k {self.data} -c max_connections=200",
            "start",
            stdout=subprocess.DEVNULL,
        )
        return True

    def wait_healthy(self) -> None:
        wait_for("postgres", self._ready, self.timeout, self.logfile)
        user, password, db = "evalstream", "evalstream", "evalstream"
        psql = [str(pg_bin() / "psql"), "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "postgres", "-qtAc"]
        if (
            pg_run(
                *psql, f"SELECT 1 FROM pg_roles WHERE rolname='{user}'", stdout=subprocess.PIPE
            ).stdout.strip()
            != "1"
        ):
            pg_run(*psql, f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
        if (
            pg_run(
                *psql, f"SELECT 1 FROM pg_database WHERE datname='{db}'", stdout=subprocess.PIPE
            ).stdout.strip()
            != "1"
        ):
            pg_run(*psql, f"CREATE DATABASE {db} OWNER {user}")

    def stop(self, timeout: float = 30.0) -> None:
        if self.pid() is not None:
            pg_run(
                str(pg_bin() / "pg_ctl"),
                "-D",
                str(self.data),
                "-m",
                "fast",
                "-w",
                "stop",
                stdout=subprocess.DEVNULL,
            )


HOSTS_TAG = "# evalstream: the hosts' network (stack.py up --hosts)"


def allow_hosts_network(hba: Path, net: str | None) -> None:
    """With the hosts' network `net`, every rule for loopback clients also admits it, with
    the same method (whatever authentication the loopback rules ask for); without, none."""
    lines = [ln for ln in hba.read_text().splitlines() if not ln.endswith(HOSTS_TAG)]
    if net:
        lines += [
            f"{ln.replace('127.0.0.1/32', net)}  {HOSTS_TAG}"
            for ln in lines
            if ln.split()[:1] in (["host"], ["hostssl"], ["hostnossl"]) and "127.0.0.1/32" in ln.split()
        ]
    hba.write_text("\n".join(lines) + "\n")
