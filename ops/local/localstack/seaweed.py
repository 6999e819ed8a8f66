"""SeaweedFS: master, volume, filer and the S3 gateway in one process."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from evalstream.common.settings import S3Settings
from localstack import hosts
from localstack.config import S3_PORT, STACK, WEED_PORTS
from localstack.installs import weed_binary

# Each gRPC port is its HTTP port + GRPC_SHIFT. SeaweedFS's own convention (+10000) puts a
# stack's gRPC ports on the HTTP ports of the stack 10000 ports above it (offsets 12000 and
# 22000 side by side): +100 stays inside the stack's own block of ports.
GRPC_SHIFT = 100


def weed_prepare() -> None:
    s3 = S3Settings.from_env()
    d = STACK / "s3"
    (d / "data").mkdir(parents=True, exist_ok=True)
    identity = {
        "identities": [
            {
                "name": "evalstream",
                "credentials": [
                    {
                        "accessKey": s3.s3_access_key,
                        "secretKey": s3.s3_secret_key,
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
        f"-master.port.grpc={WEED_PORTS['master'] + GRPC_SHIFT}",
        f"-volume.port.grpc={WEED_PORTS['volume'] + GRPC_SHIFT}",
        f"-filer.port.grpc={WEED_PORTS['filer'] + GRPC_SHIFT}",
        "-master.volumeSizeLimitMB=256",
        "-volume.max=64",
        "-s3",
        f"-s3.port={S3_PORT}",
        f"-s3.port.grpc={S3_PORT + GRPC_SHIFT}",
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


# --------------------------------------------------------------------------- the hosts' gateway


def weed_hosts_argv() -> list[str]:
    """A second S3 gateway of the same store, on the hosts' network (`up --hosts N`): hosts
    reach S3 at the infrastructure's address as other machines would, while loopback
    clients keep theirs. It reads and writes through the filer, as every gateway does (S3
    clients never talk to a volume server, so no volume URL needs to be reachable)."""
    d = STACK / "s3"
    filer = f"127.0.0.1:{WEED_PORTS['filer']}.{WEED_PORTS['filer'] + GRPC_SHIFT}"  # host:port.grpcPort
    return [
        str(weed_binary()),
        "s3",
        f"-filer={filer}",
        f"-ip.bind={hosts.gateway()}",
        f"-port={S3_PORT}",
        f"-port.grpc={S3_PORT + GRPC_SHIFT}",
        "-port.iceberg=0",
        f"-config={d / 's3.json'}",
    ]


def weed_hosts_healthy() -> bool:
    try:
        urllib.request.urlopen(f"http://{hosts.gateway()}:{S3_PORT}/", timeout=2)
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
    return True
