"""PostgreSQL from Debian, run as the postgres user (pg_ctl daemonises by itself).

Authentication (pg_hba.conf, rewritten at every start): TCP connections need a password
(scram-sha-256), for every role; only the postgres superuser may connect without one, over
the UNIX socket in the data folder (mode 700) and as the postgres OS user (peer). The
evalstream role (the owner of the tables) and a role per component (db_roles.py: producer,
aggregator, worker, user) get the stack's passwords (credentials.py), set again at every `up`,
as do the superuser's least-privilege steps (db_roles.superuser_sql: advisory locks); the
grants on the tables are bootstrap's (db_roles.apply, as the owner)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from evalstream.common import db_roles
from localstack import hosts
from localstack.config import PG_PORT, STACK, log, run, wait_for
from localstack.credentials import PG_DB, PG_USER, pg_password, pg_role_passwords
from localstack.installs import pg_bin
from localstack.proc import Proc

HBA = """\
# Written by ops/local/localstack/postgres.py at every start: edits are overwritten.
# TYPE  DATABASE  USER      ADDRESS        METHOD
local   all       postgres                 peer
host    all       all       127.0.0.1/32   scram-sha-256
host    all       all       ::1/128        scram-sha-256
"""


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
                "--auth-local=peer",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                stdout=subprocess.DEVNULL,
            )
        self.logfile.touch()
        shutil.chown(self.logfile, "postgres", "postgres")
        listen = "127.0.0.1"
        self._write_hba()
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

    @property
    def hba(self) -> Path:
        return self.data / "pg_hba.conf"

    def _write_hba(self) -> bool:
        """Writes pg_hba.conf (with --hosts, its TCP rules admit the hosts' network too); True
        if it changed (a running server must reload it)."""
        before = self.hba.read_text() if self.hba.exists() else None
        self.hba.write_text(HBA)
        allow_hosts_network(self.hba, str(hosts.subnet()) if hosts.configured() else None)
        shutil.chown(self.hba, "postgres", "postgres")
        self.hba.chmod(0o600)
        return self.hba.read_text() != before

    def wait_healthy(self) -> None:
        wait_for("postgres", self._ready, self.timeout, self.logfile)
        user, db = PG_USER, PG_DB
        # the superuser over the socket in the data folder (peer), never over TCP
        psql = [str(pg_bin() / "psql"), "-h", str(self.data), "-p", str(PG_PORT), "-U", "postgres", "-qtAc"]
        if self._write_hba():  # a server started before passwords came in still trusted TCP
            log("postgres: password authentication on TCP (pg_hba.conf rewritten, reloaded)")
            pg_run(*psql, "SELECT pg_reload_conf()", stdout=subprocess.DEVNULL)
        if (
            pg_run(
                *psql, f"SELECT 1 FROM pg_roles WHERE rolname='{user}'", stdout=subprocess.PIPE
            ).stdout.strip()
            != "1"
        ):
            pg_run(*psql, f"CREATE ROLE {user} LOGIN")
        # The passwords through stdin, not the command line; SCRAM-hashed by the server.
        password = pg_password().replace("'", "''")
        self._psql_stdin(
            f"SET password_encryption = 'scram-sha-256';\nALTER ROLE {user} LOGIN PASSWORD '{password}';\n"
            + db_roles.login_roles_sql(user, pg_role_passwords())
        )
        if (
            pg_run(
                *psql, f"SELECT 1 FROM pg_database WHERE datname='{db}'", stdout=subprocess.PIPE
            ).stdout.strip()
            != "1"
        ):
            pg_run(*psql, f"CREATE DATABASE {db} OWNER {user}")
        self._psql_stdin(db_roles.superuser_sql(user, db), database=db)

    def _psql_stdin(self, sql: str, database: str = "postgres") -> None:
        """`sql` run by the superuser (over the socket in the data folder), read from stdin."""
        pg_run(
            str(pg_bin() / "psql"),
            "-h",
            str(self.data),
            "-p",
            str(PG_PORT),
            "-U",
            "postgres",
            "-d",
            database,
            "-qtA",
            "-v",
            "ON_ERROR_STOP=1",
            input=sql,
            stdout=subprocess.DEVNULL,
        )

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
