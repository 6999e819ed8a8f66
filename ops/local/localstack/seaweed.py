"""SeaweedFS: master, volume, filer and the S3 gateway in one process.

Only the S3 gateway serves clients, and it takes signed requests only, from the key pairs of
s3_identities.py (each allowed its own buckets and names; no anonymous access, no IAM API).
What lies behind it is closed to everyone else on the host:

* HTTP: the master's and the filer's HTTP APIs are off (`-disableHttp`: the gateway uses
  gRPC), and the volume server serves a read or a write only with a JWT signed by this stack's
  keys (`[jwt.signing]`, `[jwt.signing.read]`; its UI is off); the filer's HTTP, were it
  turned on, would ask for its own JWTs (`[jwt.filer_signing]`, `.read`).
* gRPC: every gRPC port (master, volume, filer, S3) takes mutual TLS only, with certificates
  of this stack's own CA (`[grpc.*]`), so that no client without them reaches the filer's
  metadata or asks for a volume assignment (and its write JWT).

The keys, certificates, security.toml and the identity file live in
<stack>/secrets/seaweedfs (mode 700, files 600); `weed -config_dir=` reads security.toml there.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from evalstream.common import s3_identities
from evalstream.common.settings import S3Settings
from localstack import hosts
from localstack.config import S3_PORT, STACK, WEED_PORTS
from localstack.credentials import s3_keys, secret, secrets_folder
from localstack.installs import weed_binary

# Each gRPC port is its HTTP port + GRPC_SHIFT. SeaweedFS's own convention (+10000) puts a
# stack's gRPC ports on the HTTP ports of the stack 10000 ports above it (offsets 12000 and
# 22000 side by side): +100 stays inside the stack's own block of ports.
GRPC_SHIFT = 100
JWT_KEYS = ("volume-write", "volume-read", "filer-write", "filer-read")
GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "client")


def weed_config_dir() -> Path:
    folder = Path(secrets_folder()) / "seaweedfs"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def identity_file() -> Path:
    return weed_config_dir() / "s3.json"


def identity_config() -> str:
    """The identity file (`-s3.config`): a key pair per principal of s3_identities.py."""
    keys = {p: s3_keys(p) for p in s3_identities.PRINCIPALS}
    return json.dumps(s3_identities.config(keys, S3Settings.from_env()), indent=2) + "\n"


def security_config() -> str:
    """security.toml: the JWT signing keys and the gRPC mutual TLS (certificates made on first
    use)."""
    folder = weed_config_dir()
    tls = tls_files(folder)
    jwt = {name: secret(f"seaweedfs-jwt-{name}.key") for name in JWT_KEYS}
    sections = [
        "# Written by ops/local/localstack/seaweed.py at every start of SeaweedFS: edits are overwritten.",
        f'[jwt.signing]\nkey = "{jwt["volume-write"]}"\nexpires_after_seconds = 10',
        f'[jwt.signing.read]\nkey = "{jwt["volume-read"]}"\nexpires_after_seconds = 10',
        f'[jwt.filer_signing]\nkey = "{jwt["filer-write"]}"\nexpires_after_seconds = 10',
        f'[jwt.filer_signing.read]\nkey = "{jwt["filer-read"]}"\nexpires_after_seconds = 10',
        "[access]\nui = false",
        "[filer.expose_directory_metadata]\nenabled = false",
        f'[grpc]\nca = "{tls["ca.crt"]}"',
        *(f'[grpc.{c}]\ncert = "{tls["node.crt"]}"\nkey = "{tls["node.key"]}"' for c in GRPC_COMPONENTS),
    ]
    return "\n\n".join(sections) + "\n"


def tls_files(folder: Path) -> dict[str, Path]:
    """The stack's own CA and one certificate it signed for every SeaweedFS component (and
    its clients: mutual TLS), made with openssl on first use and kept."""
    files = {name: folder / name for name in ("ca.crt", "ca.key", "node.crt", "node.key")}
    if all(p.exists() for p in files.values()):
        return files
    old_umask = os.umask(0o077)
    try:
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        ca_subject = "/CN=evalstream local stack CA"
        _openssl("req", "-x509", *ec, "-days", "3650", "-subj", ca_subject, "-keyout", str(files["ca.key"]),
                 "-out", str(files["ca.crt"]))  # fmt: skip
        csr, ext = folder / "node.csr", folder / "node.ext"
        ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
        _openssl("req", *ec, "-subj", "/CN=seaweedfs", "-keyout", str(files["node.key"]), "-out", str(csr))
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(files["ca.crt"]), "-CAkey", str(files["ca.key"]),
                 "-CAcreateserial", "-days", "3650", "-extfile", str(ext), "-out", str(files["node.crt"]))  # fmt: skip
        for leftover in (csr, ext, folder / "ca.srl"):
            leftover.unlink(missing_ok=True)
    finally:
        os.umask(old_umask)
    return files


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)


def weed_prepare() -> None:
    (STACK / "s3" / "data").mkdir(parents=True, exist_ok=True)
    _write_private(identity_file(), identity_config())
    _write_private(weed_config_dir() / "security.toml", security_config())
    # before identities: the documented default keys, readable by anyone on the host
    (STACK / "s3" / "s3.json").unlink(missing_ok=True)


def weed_config_current(pid: int) -> bool:
    """Whether the running SeaweedFS (pid) was started as weed_argv() says, with the identity
    file and security.toml of now (a stack from before identities is not)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        files = [
            (identity_file(), identity_config()),
            (weed_config_dir() / "security.toml", security_config()),
        ]
        return argv == weed_argv() and all(p.exists() and p.read_text() == text for p, text in files)
    except OSError:
        return False


def weed_argv() -> list[str]:
    d = STACK / "s3"
    return [
        str(weed_binary()),
        f"-config_dir={weed_config_dir()}",
        "server",
        f"-dir={d / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-disableHttp",  # the master's and filer's HTTP APIs: the gateway needs neither
        f"-master.port={WEED_PORTS['master']}",
        f"-volume.port={WEED_PORTS['volume']}",
        f"-filer.port={WEED_PORTS['filer']}",
        f"-master.port.grpc={WEED_PORTS['master'] + GRPC_SHIFT}",
        f"-volume.port.grpc={WEED_PORTS['volume'] + GRPC_SHIFT}",
        f"-filer.port.grpc={WEED_PORTS['filer'] + GRPC_SHIFT}",
        "-master.volumeSizeLimitMB=256",
        "-volume.max=64",
        "-s3",
        f"-s3.port={S3_PORT}",
        f"-s3.port.grpc={S3_PORT + GRPC_SHIFT}",
        f"-s3.config={identity_file()}",
        "-s3.iam=false",  # no IAM API: identities come from the file only
        # nor its Iceberg REST catalog and Lance namespace servers (the pipeline uses neither;
        # by default they listen on fixed ports, 8181 and 9101, whatever the stack's offset)
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
    ]


def weed_healthy() -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{S3_PORT}/", timeout=2)
    except urllib.error.HTTPError:
        return True  # 403 without credentials: the gateway answers
    except (urllib.error.URLError, OSError):
        return False
    return True


# --------------------------------------------------------------------------- the hosts' gateway


def weed_hosts_argv() -> list[str]:
    """A second S3 gateway of the same store, on the hosts' network (`up --hosts N`): hosts
    reach S3 at the infrastructure's address as other machines would, while loopback
    clients keep theirs. It reads and writes through the filer, as every gateway does (S3
    clients never talk to a volume server, so no volume URL needs to be reachable), over
    gRPC with the stack's certificate, and takes the same identities."""
    filer = f"127.0.0.1:{WEED_PORTS['filer']}.{WEED_PORTS['filer'] + GRPC_SHIFT}"  # host:port.grpcPort
    return [
        str(weed_binary()),
        f"-config_dir={weed_config_dir()}",
        "s3",
        f"-filer={filer}",
        f"-ip.bind={hosts.gateway()}",
        f"-port={S3_PORT}",
        f"-port.grpc={S3_PORT + GRPC_SHIFT}",
        "-port.iceberg=0",
        "-port.lance=0",
        f"-config={identity_file()}",
        "-iam=false",
    ]


def weed_hosts_healthy() -> bool:
    try:
        urllib.request.urlopen(f"http://{hosts.gateway()}:{S3_PORT}/", timeout=2)
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
    return True
