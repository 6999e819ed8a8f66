"""What the stack installs on first use, cached under $EVALSTREAM_CACHE: Debian packages,
Kafka's jars from Maven Central, a SeaweedFS build, Toxiproxy (for `--hosts`)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from localstack.config import CACHE, KAFKA_VERSION, ROOT, SEAWEEDFS_VERSION, TOXIPROXY_VERSION, log, run


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


# Deployment tools for the offline checks of the Helm chart and the compose files
# (tests/deploy): built from the Go module proxy like SeaweedFS, once, then cached.
HELM_VERSION = "v3.22.0"
COMPOSE_VERSION = "v5.6.0"  # the newest whose go.mod the machines' Go (1.26.8) accepts


def helm_binary() -> Path:
    return go_tool("helm", "helm.sh/helm/v3/cmd/helm", HELM_VERSION)


def compose_binary() -> Path:
    """Docker Compose's CLI (`docker-compose config` needs no engine). Its go.mod has exclude
    directives, which `go install pkg@version` refuses: built inside the module instead."""
    return go_tool("docker-compose", "github.com/docker/compose/v5", COMPOSE_VERSION, in_module="./cmd")


def go_tool(name: str, package: str, version: str, in_module: str | None = None) -> Path:
    """`go install package@version`, or with `in_module`, `go build` of that package inside
    the downloaded module `package` (where its own go.mod rules); cached as
    $EVALSTREAM_CACHE/<name>-<version>/<name>."""
    binary = CACHE / f"{name}-{version}" / name
    if binary.exists():
        return binary
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f"{name}-{version}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test sessions on a cold machine: one builds
        if not binary.exists():
            _go_build(name, package, version, in_module, binary)
    return binary


def _go_build(name: str, package: str, version: str, in_module: str | None, binary: Path) -> None:
    log(f"building {name} {version} with the Go toolchain (first time only, a few minutes)")
    tmp = binary.parent.with_name(f"{binary.parent.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = {**os.environ, "GOFLAGS": "-buildvcs=false", "CGO_ENABLED": "0"}
    if in_module is None:
        run(
            ["go", "install", f"{package}@{version}"],
            env={**env, "GOBIN": str(tmp)},
            cwd="/",
            stdout=sys.stderr,
        )
        (built,) = tmp.iterdir()  # named after the package's last element
        built.rename(tmp / name)
    else:
        out = run(
            ["go", "mod", "download", "-json", f"{package}@{version}"],
            env=env,
            stdout=subprocess.PIPE,
            cwd="/",
        )
        src = CACHE / f"{name}-src"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(Path(json.loads(out.stdout)["Dir"]), src)
        run(["chmod", "-R", "u+w", str(src)])
        env["GOFLAGS"] += " -mod=mod"  # the module's go.sum may lack entries of test-only deps
        run(
            ["go", "build", "-trimpath", "-o", str(tmp / name), in_module],
            cwd=src,
            env=env,
            stdout=sys.stderr,
        )
        shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(binary.parent, ignore_errors=True)
    tmp.rename(binary.parent)


def toxiproxy_binary() -> Path:
    """Toxiproxy's server, the fault proxy between a host and the broker (`up --hosts N`)."""
    return go_tool("toxiproxy-server", "github.com/Shopify/toxiproxy/v2/cmd/server", TOXIPROXY_VERSION)
