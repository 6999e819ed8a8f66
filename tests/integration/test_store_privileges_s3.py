"""Least privilege in the object store, on the real stack: every S3 key pair (s3_identities.py)
may do what its actions grant and is refused the rest, the documented default keys and
anonymous requests are refused, and nothing behind the S3 gateway (SeaweedFS's filer, master
and volume server, over HTTP or gRPC) takes a request from a client without the stack's
credentials. The database: tests/integration/test_store_privileges_postgres.py."""

from __future__ import annotations

import socket
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from minio import Minio
from minio.error import S3Error

from evalstream.common import acls, s3_identities, storage
from evalstream.common.settings import Settings
from tests.support import STACK, admin_settings, principal_settings

# local_stack (conftest.py): these tests are about the local stack's roles and identities
pytestmark = [pytest.mark.stack, pytest.mark.usefixtures("local_stack")]

# --------------------------------------------------------------------------- S3: identities

DEFAULT_KEYS = ("evalstream", "evalstream-secret")  # settings.py's defaults, the README's example


def s3_client(settings: Settings, keys: tuple[str, str] | None = None) -> Minio:
    if keys is None:
        return storage.client(settings)
    url = urlsplit(settings.s3_endpoint)
    return Minio(url.netloc, access_key=keys[0], secret_key=keys[1], region=settings.s3_region, secure=False)


@pytest.fixture(scope="module")
def planted() -> Iterator[dict[str, str]]:
    """Objects to read and to delete, put by the admin in both buckets; removed afterwards."""
    s = admin_settings()
    admin = storage.client(s)
    tag = uuid.uuid4().hex[:8]
    run = f"probe-{tag}"
    names = {
        "upload": (s.s3_bucket_datasets, f"uploads/{tag}/qa.jsonl"),
        "copy": (s.s3_bucket_datasets, f"datasets/{tag}/items.jsonl"),
        "report": (s.s3_bucket_results, f"runs/{run}/report.json"),
    }
    for bucket, key in names.values():
        storage.put_bytes(admin, bucket, key, b'{"id": "1"}\n', "application/json")
    yield {"tag": tag, "run": run, **{k: f"{b}/{n}" for k, (b, n) in names.items()}}
    for bucket, key in names.values():
        admin.remove_object(bucket, key)


def at(location: str) -> tuple[str, str]:
    """ "bucket/key" -> (bucket, key)."""
    bucket, key = location.split("/", 1)
    return bucket, key


def s3_probes(settings: Settings, planted: dict[str, str]) -> dict[str, tuple[str, str, str]]:
    """name -> (action, bucket, key) of every probe; a Write to a new key is a PUT."""
    datasets, results = settings.s3_bucket_datasets, settings.s3_bucket_results
    tag, run = planted["tag"], planted["run"]
    return {
        "read an upload": ("Read", *at(planted["upload"])),
        "read a stored copy": ("Read", *at(planted["copy"])),
        "read a report": ("Read", *at(planted["report"])),
        "list datasets": ("List", datasets, ""),
        "list results": ("List", results, ""),
        "upload a dataset": ("Write", datasets, f"uploads/{tag}/new.jsonl"),
        "write a stored copy": ("Write", datasets, f"datasets/{tag}-new/items.jsonl"),
        "write elsewhere in datasets": ("Write", datasets, f"other/{tag}.jsonl"),
        "write a manifest": ("Write", results, f"runs/{run}/manifest.json"),
        "write a report": ("Write", results, f"runs/{run}-new/report.json"),
        "write a report page": ("Write", results, f"runs/{run}/report.html"),
        "write a results segment": ("Write", results, f"runs/{run}/results/part-000000.parquet"),
        "write the Delta table": ("Write", results, f"tables/{tag}/_delta_log/probe.json"),
        "write elsewhere in results": ("Write", results, f"other/{tag}.json"),
        "delete an upload": ("Delete", *at(planted["upload"])),
        "delete a stored copy": ("Delete", *at(planted["copy"])),
        "delete a report": ("Delete", *at(planted["report"])),
        "create a bucket": ("Admin", f"probe-{tag}", ""),
    }


def try_s3(client: Minio, action: str, bucket: str, key: str) -> bool:
    """Whether the store let `client` do it (AccessDenied and the like: refused)."""
    try:
        if action == "Read":
            storage.get_bytes(client, bucket, key)
        elif action == "List":
            list(client.list_objects(bucket, recursive=True))
        elif action == "Write":
            storage.put_bytes(client, bucket, key, b"forged\n", "application/octet-stream")
        elif action == "Delete":
            client.remove_object(bucket, key)
            # S3 answers a delete of a missing key with success too: the object must be gone
            return not exists(bucket, key)
        elif action == "Admin":
            client.make_bucket(bucket)
        return True
    except S3Error as exc:
        if exc.code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"):
            return False
        raise


def exists(bucket: str, key: str) -> bool:
    try:
        storage.client(admin_settings()).stat_object(bucket, key)
        return True
    except S3Error:
        return False


def undo(settings: Settings, probes: dict[str, tuple[str, str, str]], planted: dict[str, str]) -> None:
    """What allowed probes left: written objects removed, deleted ones put back, buckets gone."""
    admin = storage.client(admin_settings())
    for action, bucket, key in probes.values():
        if action == "Write":
            admin.remove_object(bucket, key)
        elif action == "Admin" and admin.bucket_exists(bucket):
            admin.remove_bucket(bucket)
    for name in ("upload", "copy", "report"):
        bucket, key = at(planted[name])
        if not exists(bucket, key):
            storage.put_bytes(admin, bucket, key, b'{"id": "1"}\n', "application/json")


@pytest.mark.parametrize("principal", [p for p in s3_identities.PRINCIPALS if p != acls.ADMIN])
def test_each_key_pair_may_do_what_its_actions_grant_and_is_refused_the_rest(
    principal: str, planted: dict[str, str]
) -> None:
    settings = principal_settings(principal)
    assert settings.s3_access_key and (settings.s3_access_key, settings.s3_secret_key) != DEFAULT_KEYS
    client = storage.client(settings)
    probes = s3_probes(settings, planted)
    try:
        actual = {name: try_s3(client, *probe) for name, probe in probes.items()}
    finally:
        undo(settings, probes, planted)
    expected = {
        name: s3_identities.allows(
            principal, "Write" if action == "Delete" else action, bucket, key, settings
        )
        for name, (action, bucket, key) in probes.items()
    }
    assert any(expected.values())
    assert actual == expected


def test_who_has_no_identity_is_refused_everything(planted: dict[str, str]) -> None:
    """The documented default keys, the router's and a worker's (they have none: empty keys
    are anonymous), no keys at all, a user's access key with a wrong secret: every probe is
    refused, as is the list of buckets."""
    settings = admin_settings()
    router, worker = principal_settings(acls.ROUTER), principal_settings(acls.WORKER)
    assert (router.s3_access_key, router.s3_secret_key) == ("", ""), "the router has S3 keys"
    assert (worker.s3_access_key, worker.s3_secret_key) == ("", ""), "a worker has S3 keys"
    nobody = {
        "the documented default keys": DEFAULT_KEYS,
        "no keys (anonymous, as the router and workers have)": ("", ""),
        "a wrong secret": (principal_settings(acls.USER).s3_access_key, "wrong-secret"),
    }
    probes = s3_probes(settings, planted)
    actual: dict[str, dict[str, bool]] = {}
    try:
        for who, keys in nobody.items():
            client = s3_client(settings, keys)
            actual[who] = {name: try_s3(client, *probe) for name, probe in probes.items()}
            try:
                client.list_buckets()
                actual[who]["list buckets"] = True
            except S3Error:
                actual[who]["list buckets"] = False
    finally:
        undo(settings, probes, planted)
    granted = {who: [name for name, ok in done.items() if ok] for who, done in actual.items()}
    assert granted == {who: [] for who in nobody}


def test_the_object_store_attack_of_the_issue_is_refused(stack: Settings, planted: dict[str, str]) -> None:
    """A user (the keys `stack.py env` hands out) cannot overwrite a run's report, and the
    default keys write nothing; the pipeline's own identities still work (positive control)."""
    bucket, key = at(planted["report"])
    for keys in (None, DEFAULT_KEYS):
        with pytest.raises(S3Error) as refused:
            storage.put_bytes(s3_client(stack, keys), bucket, key, b'{"accuracy": 1.0}', "application/json")
        assert refused.value.code in ("AccessDenied", "InvalidAccessKeyId")
    admin = storage.client(admin_settings())
    assert storage.get_bytes(admin, bucket, key) == b'{"id": "1"}\n'
    upload = f"uploads/{planted['tag']}/mine.jsonl"
    storage.put_bytes(
        storage.client(stack), stack.s3_bucket_datasets, upload, b"{}\n", "application/x-ndjson"
    )
    admin.remove_object(stack.s3_bucket_datasets, upload)


# --------------------------------------------------------------------------- behind the gateway


def weed_ports(settings: Settings) -> dict[str, int]:
    """SeaweedFS's HTTP ports on this stack (ops/local/localstack/config.py WEED_PORTS; the
    stack's offset is the S3 port's), and their gRPC ports (+100, seaweed.GRPC_SHIFT)."""
    offset = int(urlsplit(settings.s3_endpoint).port or 8333) - 8333
    http = {"master": 9333 + offset, "volume": 8380 + offset, "filer": 8888 + offset, "s3": 8333 + offset}
    return {**http, **{f"{name} grpc": port + 100 for name, port in http.items()}}


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_filer_master_and_volume_server_refuse_clients_without_credentials(
    stack: Settings, planted: dict[str, str]
) -> None:
    """Over HTTP, without credentials: a PUT into a bucket through the filer, a listing of the
    buckets through the filer, a read of an object through it, a volume assignment from the
    master (which would come with a write token), a write and a read on the volume server:
    all refused, and nothing lands."""
    ports = weed_ports(stack)
    filer, master, volume = (f"http://127.0.0.1:{ports[n]}" for n in ("filer", "master", "volume"))
    admin = storage.client(admin_settings())
    bucket, key = at(planted["upload"])
    victim = f"uploads/{planted['tag']}/victim.jsonl"  # what a DELETE through the filer would take
    storage.put_bytes(admin, bucket, victim, b"victim\n", "application/x-ndjson")
    forged = f"/buckets/{bucket}/uploads/{planted['tag']}/forged.jsonl"
    try:
        attempts = {
            "filer PUT": http("PUT", filer + forged, b"forged"),
            "filer POST": http("POST", filer + forged, b"forged"),
            "filer lists buckets": http("GET", filer + "/buckets/", headers={"Accept": "application/json"}),
            "filer reads an object": http("GET", f"{filer}/buckets/{bucket}/{key}"),
            "filer DELETE": http("DELETE", f"{filer}/buckets/{bucket}/{victim}"),
            "master assigns a volume": http("GET", master + "/dir/assign"),
            "master looks a volume up": http("GET", master + "/dir/lookup?volumeId=1"),
            "master shows the topology": http("GET", master + "/dir/status"),
            "volume write": http("POST", volume + "/1,01637037d6", b"forged"),
            "volume read": http("GET", volume + "/1,01637037d6"),
        }
        granted = {name: status for name, (status, _) in attempts.items() if status < 400}
        assert granted == {}
        assert not exists(bucket, f"uploads/{planted['tag']}/forged.jsonl")
        assert storage.get_bytes(admin, bucket, victim) == b"victim\n"  # the gateway serves it still
    finally:
        admin.remove_object(bucket, victim)
        admin.remove_object(bucket, f"uploads/{planted['tag']}/forged.jsonl")


# HTTP/2's client preface and an empty SETTINGS frame: what a gRPC client sends first.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def tls_handshake(port: int, cert: tuple[Path, Path] | None) -> bool:
    """Whether a TLS connection to a gRPC port gets as far as the server's first HTTP/2 frame
    (mutual TLS: only with a client certificate the server trusts)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the server's identity is not what this checks
    context.set_alpn_protocols(["h2"])
    if cert:
        context.load_cert_chain(*cert)
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            context.wrap_socket(raw) as tls,
        ):
            tls.sendall(H2_PREFACE)
            return len(tls.recv(9)) == 9  # a frame header: the server talks gRPC to us
    except (ssl.SSLError, ConnectionError, TimeoutError, OSError):
        return False


def plaintext_grpc(port: int) -> bool:
    """Whether a gRPC port answers an HTTP/2 client without TLS."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(H2_PREFACE)
            header = s.recv(9)
            return len(header) == 9 and header[3] == 0x04  # a SETTINGS frame
    except (ConnectionError, TimeoutError, OSError):
        return False


def test_grpc_ports_take_only_the_stacks_certificates(stack: Settings) -> None:
    """The filer's gRPC API reads and writes every entry and assigns volumes: every gRPC port
    takes mutual TLS with the stack's certificate only (positive control: with it, it talks)."""
    folder = STACK / "secrets" / "seaweedfs"
    ours = (folder / "node.crt", folder / "node.key")
    for name in ("master grpc", "volume grpc", "filer grpc", "s3 grpc"):
        port = weed_ports(stack)[name]
        assert not plaintext_grpc(port), f"{name} answers without TLS"
        assert not tls_handshake(port, None), f"{name} answers without a client certificate"
        assert tls_handshake(port, ours), f"{name} refuses the stack's own certificate"


def test_seaweedfs_own_client_without_the_certificates_gets_nothing(stack: Settings, tmp_path: Path) -> None:
    """`weed shell` (SeaweedFS's admin client) without the stack's security.toml lists no bucket."""
    weed = next((Path.home() / ".cache/evalstream").glob("seaweedfs-*/weed"), None)
    assert weed is not None, "the stack's SeaweedFS build"
    ports = weed_ports(stack)
    command = [
        str(weed),
        "shell",
        f"-master=127.0.0.1:{ports['master']}.{ports['master grpc']}",
        f"-filer=127.0.0.1:{ports['filer']}.{ports['filer grpc']}",
    ]
    try:
        out = subprocess.run(
            command,
            input="fs.ls /buckets\n",
            capture_output=True,
            text=True,
            timeout=20,
            cwd=tmp_path,
            env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        ).stdout
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    assert stack.s3_bucket_datasets not in out


def test_the_stores_secrets_are_the_roots_alone(stack: Settings) -> None:
    """The identity file, security.toml, the CA and the certificates' keys: mode 600 in a
    folder of mode 700; no world-readable identity file is left from before."""
    folder = STACK / "secrets" / "seaweedfs"
    assert folder.stat().st_mode & 0o777 == 0o700
    for name in ("s3.json", "security.toml", "ca.key", "node.key"):
        assert (folder / name).stat().st_mode & 0o777 == 0o600, name
    assert not (STACK / "s3" / "s3.json").exists()
