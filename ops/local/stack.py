#!/usr/bin/env python3
"""The evalstream topology as local processes, for machines without a Docker engine.

    python ops/local/stack.py up [--workers N] [--infra-only]   install on first use, start, wait healthy
    python ops/local/stack.py ps | down | clean | logs NAME

Installs are cached under $EVALSTREAM_CACHE (default ~/.cache/evalstream); data, pid files
and logs live in one folder, $EVALSTREAM_STACK (default <repo>/.stack). `up` starts only
what is not running, so a second `up` takes seconds. Standard library only (plus the
project's venv for the bootstrap step), so it runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "libs" / "common"))
from evalstream.common.settings import DEFAULTS, SERVICE_PORTS  # noqa: E402

CACHE = Path(os.environ.get("EVALSTREAM_CACHE", Path.home() / ".cache" / "evalstream"))
STACK = Path(os.environ.get("EVALSTREAM_STACK", ROOT / ".stack"))
VENV_PY = ROOT / ".venv" / "bin" / "python"

KAFKA_VERSION = "4.4.0"
SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
APT_PACKAGES = ["postgresql", "prometheus", "bubblewrap", "chromium"]  # chromium: report tests
# A second stack (the fault-injection suite's, which kills brokers and databases) runs
# beside the development one with every port shifted by EVALSTREAM_PORT_OFFSET.
OFFSET = int(os.environ.get("EVALSTREAM_PORT_OFFSET", "0"))
KAFKA_PORT, KAFKA_CONTROLLER_PORT = 9092 + OFFSET, 9093 + OFFSET
PG_PORT, S3_PORT, PROM_PORT = 5432 + OFFSET, 8333 + OFFSET, 9090 + OFFSET
WEED_PORTS = {"master": 9333 + OFFSET, "volume": 8380 + OFFSET, "filer": 8888 + OFFSET}
PORTS = {name: port + OFFSET for name, port in SERVICE_PORTS.items()}


def client_env() -> dict[str, str]:
    """How services and tests reach this stack (the settings' names)."""
    return {
        "KAFKA_BOOTSTRAP": f"127.0.0.1:{KAFKA_PORT}",
        "DATABASE_URL": f"postgresql://evalstream:evalstream@127.0.0.1:{PG_PORT}/evalstream",
        "S3_ENDPOINT": f"http://127.0.0.1:{S3_PORT}",
        "PROMETHEUS_URL": f"http://127.0.0.1:{PROM_PORT}",
        "EVALSTREAM_STACK": str(STACK),
    }


def log(msg: str) -> None:
    print(f"[stack] {msg}", flush=True)


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, **kw)  # type: ignore[call-overload]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.closing(socket.socket()) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError):
        return False


def wait_for(what: str, check: Callable[[], bool], timeout: float, logfile: Path | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    where = f"; its log: {logfile}" if logfile else ""
    tail = ""
    if logfile and logfile.exists():
        tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-15:])
    raise SystemExit(f"[stack] {what} did not become healthy within {timeout:.0f}s{where}\n{tail}")


# --------------------------------------------------------------------------- installs


def pg_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        raise FileNotFoundError("initdb")
    return found[-1].parent


def install_apt() -> None:
    missing = [
        p
        for p, probe in (("prometheus", "prometheus"), ("bubblewrap", "bwrap"), ("chromium", "chromium"))
        if not shutil.which(probe)
    ]
    try:
        pg_bin()
    except FileNotFoundError:
        missing.append("postgresql")
    if not missing:
        return
    log(f"installing from Debian: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", *missing], env=env, stdout=subprocess.DEVNULL)


def kafka_libs() -> Path:
    return maven_jars("broker", ROOT / "ops/local/kafka/pom.xml", CACHE / f"kafka-{KAFKA_VERSION}" / "libs")


def kafka_tools_libs() -> Path:
    """Kafka's command-line tools (ConsoleProducer, ...), fetched on first use only."""
    return maven_jars(
        "command-line tools",
        ROOT / "ops/local/kafka/tools-pom.xml",
        CACHE / f"kafka-tools-{KAFKA_VERSION}" / "libs",
    )


def maven_jars(what: str, pom: Path, libs: Path) -> Path:
    """Every runtime jar of `pom`'s dependencies, copied from Maven Central into `libs` once."""
    if (libs / ".complete").exists():
        return libs
    log(f"fetching Apache Kafka {KAFKA_VERSION} {what} jars from Maven Central")
    tmp = libs.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(pom),
            f"-Dkafka.version={KAFKA_VERSION}",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={tmp}",
        ],
        stdout=sys.stderr,  # Maven's noise, never mixed into a printed classpath
    )
    shutil.rmtree(libs, ignore_errors=True)
    tmp.rename(libs)
    (libs / ".complete").touch()
    return libs


def weed_binary() -> Path:
    binary = CACHE / f"seaweedfs-{SEAWEEDFS_VERSION}" / "weed"
    if binary.exists():
        return binary
    # `go install pkg@version` refuses modules whose go.mod has replace directives (SeaweedFS
    # has one), so build inside the downloaded module instead, where it is the main module.
    log("building SeaweedFS with the Go toolchain (first time only, a few minutes)")
    env = {**os.environ, "GOFLAGS": "-buildvcs=false -mod=mod"}
    out = run(
        ["go", "mod", "download", "-json", f"github.com/seaweedfs/seaweedfs@{SEAWEEDFS_VERSION}"],
        env=env,
        stdout=subprocess.PIPE,
        cwd="/",
    )
    src_dir = Path(json.loads(out.stdout)["Dir"])
    build = CACHE / "seaweedfs-src"
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(src_dir, build)
    run(["chmod", "-R", "u+w", str(build)])
    binary.parent.mkdir(parents=True, exist_ok=True)
    run(["go", "build", "-o", str(binary.with_suffix(".tmp")), "./weed"], cwd=build, env=env)
    binary.with_suffix(".tmp").rename(binary)
    shutil.rmtree(build, ignore_errors=True)
    return binary


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    """A background process with a pid file and a log in the stack folder."""

    name: str
    argv: Callable[[], list[str]]
    healthy: Callable[[], bool]
    timeout: float = 60.0
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None

    @property
    def pidfile(self) -> Path:
        return STACK / "run" / f"{self.name}.pid"

    @property
    def logfile(self) -> Path:
        return STACK / "logs" / f"{self.name}.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        # A stale pid file may name a reused pid: a zombie or another program is not ours.
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                return None
        except OSError:
            return None
        return pid

    def start(self) -> bool:
        """Starts the process unless it already runs; returns True if it was started."""
        if self.pid() is not None:
            return False
        if self.prepare:
            self.prepare()
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        with self.logfile.open("ab") as out:
            p = subprocess.Popen(
                self.argv(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
                cwd=ROOT,
            )
        self.pidfile.write_text(str(p.pid))
        return True

    def wait_healthy(self) -> None:
        def check() -> bool:
            if self.pid() is None:
                raise SystemExit(
                    f"[stack] {self.name} exited during start; its log: {self.logfile}\n"
                    + "\n".join(self.logfile.read_text(errors="replace").splitlines()[-20:])
                )
            return self.healthy()

        wait_for(self.name, check, self.timeout, self.logfile)

    def stop(self, timeout: float = 30.0) -> None:
        pid = self.pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.2)
        if self.pid() is not None:
            log(f"{self.name} did not stop in {timeout:.0f}s; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)


# --------------------------------------------------------------------------- Kafka


def kafka_prepare() -> None:
    d = STACK / "kafka"
    d.mkdir(parents=True, exist_ok=True)
    (d / "server.properties").write_text(f"""\
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{KAFKA_CONTROLLER_PORT}
listeners=PLAINTEXT://127.0.0.1:{KAFKA_PORT},CONTROLLER://127.0.0.1:{KAFKA_CONTROLLER_PORT}
advertised.listeners=PLAINTEXT://127.0.0.1:{KAFKA_PORT}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={d / "data"}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=12
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=168
""")
    (d / "log4j2.properties").write_text("""\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
""")
    if not (d / "data" / "meta.properties").exists():
        cp = f"{kafka_libs()}/*"
        cluster_id = run(
            ["java", "-cp", cp, "kafka.tools.StorageTool", "random-uuid"], stdout=subprocess.PIPE
        ).stdout.strip()
        run(
            [
                "java",
                "-cp",
                cp,
                f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}",
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                "-t",
                cluster_id,
                "-c",
                str(d / "server.properties"),
            ],
            stdout=subprocess.DEVNULL,
        )


def kafka_argv() -> list[str]:
    d = STACK / "kafka"
    return [
        "java",
        "-Xms256m",
        "-Xmx768m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}",
        "-cp",
        f"{kafka_libs()}/*",
        "kafka.Kafka",
        str(d / "server.properties"),
    ]


def kafka_healthy() -> bool:
    log_text = (
        (STACK / "logs" / "kafka.log").read_text(errors="replace")
        if (STACK / "logs/kafka.log").exists()
        else ""
    )
    return (port_open(KAFKA_PORT) and "Kafka Server started" in log_text.rsplit("Starting", 1)[-1]) or (
        port_open(KAFKA_PORT) and "started" in log_text[-4000:]
    )


# --------------------------------------------------------------------------- PostgreSQL


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
        # Loopback only; fsync stays on (durability is what the tests check).
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
            f"-c listen_addresses=127.0.0.1 -p {PG_PORT} -k {self.data} -c max_connections=200",
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


# --------------------------------------------------------------------------- SeaweedFS


def weed_prepare() -> None:
    d = STACK / "s3"
    (d / "data").mkdir(parents=True, exist_ok=True)
    identity = {
        "identities": [
            {
                "name": "evalstream",
                "credentials": [
                    {
                        "accessKey": os.environ.get("S3_ACCESS_KEY", DEFAULTS["S3_ACCESS_KEY"]),
                        "secretKey": os.environ.get("S3_SECRET_KEY", DEFAULTS["S3_SECRET_KEY"]),
                    }
                ],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }
    (d / "s3.json").write_text(json.dumps(identity, indent=2))


def weed_argv() -> list[str]:
    d = STACK / "s3"
    return [
        str(weed_binary()),
        "server",
        f"-dir={d / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={WEED_PORTS['master']}",
        f"-volume.port={WEED_PORTS['volume']}",
        f"-filer.port={WEED_PORTS['filer']}",
        f"-master.port.grpc={WEED_PORTS['master'] + 10000}",
        f"-volume.port.grpc={WEED_PORTS['volume'] + 10000}",
        f"-filer.port.grpc={WEED_PORTS['filer'] + 10000}",
        "-master.volumeSizeLimitMB=256",
        "-volume.max=64",
        "-s3",
        f"-s3.port={S3_PORT}",
        f"-s3.port.grpc={S3_PORT + 10000}",
        f"-s3.config={d / 's3.json'}",
    ]


def weed_healthy() -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{S3_PORT}/", timeout=2)
    except urllib.error.HTTPError:
        return True  # 403 without credentials: the gateway answers
    except (urllib.error.URLError, OSError):
        return False
    return True


# --------------------------------------------------------------------------- Prometheus


def worker_ports(n: int) -> list[int]:
    return [PORTS["worker"] + i for i in range(n)]


def prometheus_prepare(workers: int) -> None:
    d = STACK / "prometheus"
    (d / "data").mkdir(parents=True, exist_ok=True)
    src = (ROOT / "ops/prometheus/prometheus.local.yml").read_text()
    src = src.replace("__STACK__", str(d)).replace("__ROOT__", str(ROOT))
    for name, port in SERVICE_PORTS.items():
        src = src.replace(f"127.0.0.1:{port}", f"127.0.0.1:{PORTS[name]}")
    src = src.replace("127.0.0.1:9090", f"127.0.0.1:{PROM_PORT}")
    (d / "prometheus.yml").write_text(src)
    write_worker_targets(workers)
    spawned = d / "spawned.json"  # targets tests add for the services they start
    if not spawned.exists():
        spawned.write_text("[]")


def write_worker_targets(workers: int) -> None:
    d = STACK / "prometheus"
    d.mkdir(parents=True, exist_ok=True)
    targets = [
        {"targets": [f"127.0.0.1:{p}" for p in worker_ports(workers)], "labels": {"service": "worker"}}
    ]
    tmp = d / "workers.json.tmp"
    tmp.write_text(json.dumps(targets))
    tmp.replace(d / "workers.json")


def prometheus_argv() -> list[str]:
    d = STACK / "prometheus"
    return [
        "prometheus",
        f"--config.file={d / 'prometheus.yml'}",
        f"--storage.tsdb.path={d / 'data'}",
        f"--web.listen-address=127.0.0.1:{PROM_PORT}",
        "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=7d",
    ]


# --------------------------------------------------------------------------- services


def service(name: str, port: int, extra_env: dict[str, str] | None = None) -> Proc:
    return Proc(
        name=name,
        argv=lambda: [str(ROOT / ".venv/bin" / f"evalstream-{name.split('-')[0]}")],
        healthy=lambda: http_ok(f"http://127.0.0.1:{port}/healthz"),
        timeout=180,
        env={"HTTP_PORT": str(port), "PYTHONUNBUFFERED": "1", **client_env(), **(extra_env or {})},
    )


def services(workers: int) -> list[Proc]:
    procs = [service(n, PORTS[n]) for n in ("producer", "router", "aggregator")]
    procs += [
        service(f"worker-{i}", p, {"WORKER_ID": f"worker-{i}"}) for i, p in enumerate(worker_ports(workers))
    ]
    return procs


def infra() -> list[Proc]:
    return [
        Proc("kafka", kafka_argv, kafka_healthy, timeout=90, prepare=kafka_prepare),
        Postgres(),
        Proc("s3", weed_argv, weed_healthy, timeout=90, prepare=weed_prepare),
    ]


def running_workers() -> list[Proc]:
    return [service(p.stem, 0) for p in sorted((STACK / "run").glob("worker-*.pid"))]


def bootstrap() -> None:
    """Topics, buckets and the database schema; idempotent."""
    run([str(VENV_PY), "-m", "evalstream.common.bootstrap"], cwd=ROOT, env={**os.environ, **client_env()})


def up(workers: int, infra_only: bool) -> None:
    t0 = time.monotonic()
    install_apt()
    kafka_libs()
    weed_binary()
    STACK.mkdir(parents=True, exist_ok=True)
    procs = infra()
    prometheus = Proc(
        "prometheus",
        prometheus_argv,
        lambda: http_ok(f"http://127.0.0.1:{PROM_PORT}/-/ready"),
        timeout=60,
        prepare=lambda: prometheus_prepare(workers),
    )
    started = [p.name for p in procs if p.start()]
    for p in procs:
        p.wait_healthy()
    bootstrap()
    if prometheus.start():
        started.append("prometheus")
    else:
        write_worker_targets(workers)
    prometheus.wait_healthy()
    if not infra_only:
        svcs = services(workers)
        # Scale down: workers beyond the requested count are stopped (they drain first).
        for extra in running_workers()[workers:]:
            extra.stop()
        started += [p.name for p in svcs if p.start()]
        for p in svcs:
            p.wait_healthy()
    what = ", ".join(started) if started else "nothing (all running)"
    log(f"up in {time.monotonic() - t0:.1f}s; started: {what}; stack folder: {STACK}")


def all_procs() -> list[Proc]:
    prometheus = Proc("prometheus", prometheus_argv, lambda: True)
    return [*running_workers(), *services(0), prometheus, *infra()]


def ps() -> None:
    for p in all_procs():
        pid = p.pid()
        state = f"running pid {pid}" if pid else "stopped"
        print(f"{p.name:<14} {state:<20} log: {p.logfile}")


def down() -> None:
    # Services first (they drain into Kafka and PostgreSQL), infrastructure last.
    for p in all_procs():
        if p.pid() is not None:
            log(f"stopping {p.name}")
        p.stop()


def clean() -> None:
    down()
    shutil.rmtree(STACK, ignore_errors=True)
    log(f"removed {STACK}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="install on first use, start what is not running, wait until healthy")
    p_up.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "1")))
    p_up.add_argument("--infra-only", action="store_true", help="Kafka, PostgreSQL, S3 and Prometheus only")
    sub.add_parser("ps", help="list the stack's processes")
    sub.add_parser("env", help="print `export` lines that point clients (evalctl, tests) at this stack")
    sub.add_parser(
        "kafka-tools-classpath", help="the classpath of Kafka's command-line tools (fetched on first use)"
    )
    sub.add_parser("down", help="stop everything (data is kept)")
    sub.add_parser("clean", help="stop everything and delete the stack folder (data, logs)")
    p_stop = sub.add_parser("stop", help="stop one process by name")
    p_stop.add_argument("name")
    args = ap.parse_args()
    if args.cmd == "up":
        up(args.workers, args.infra_only)
    elif args.cmd == "ps":
        ps()
    elif args.cmd == "env":
        print("\n".join(f"export {k}={v}" for k, v in client_env().items()))
    elif args.cmd == "kafka-tools-classpath":
        with contextlib.redirect_stdout(sys.stderr):
            libs = kafka_tools_libs()
        print(f"{libs}/*")
    elif args.cmd == "down":
        down()
    elif args.cmd == "clean":
        clean()
    elif args.cmd == "stop":
        for p in all_procs():
            if p.name == args.name:
                p.stop()


if __name__ == "__main__":
    main()
