"""Hosts: a multi-machine rehearsal on one machine (`stack.py up --hosts N`).

Each host is a Linux network namespace with an address of its own on a private /24; its
veth link ends on the stack's bridge, which holds the address of the "infrastructure
machine" (.1) where Kafka, PostgreSQL and the S3 gateway listen beside their loopback
addresses. Host i (1-based) is 10.231.<k>.(10+i), where k is derived from the stack's port
offset (EVALSTREAM_HOSTS_SUBNET overrides the whole /24), so that two stacks never share a
network, a bridge or a namespace name. A host has no default route: like a machine on an
isolated network it reaches the infrastructure and the other hosts, nothing else.

With `--services-host`, the router and the aggregator run on a host of their own, host0
(.10), so that they too reach everything over the network (the producer stays beside the
infrastructure: `evalctl submit` and the tests hand it datasets there).

Taking a host's link down (`stack.py link hostN down`) partitions it from every service.
`stack.py down` removes every namespace, link and address it created.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from localstack.config import OFFSET, STACK, log

STATE = STACK / "hosts.json"  # the stack's host count: `up` without --hosts keeps it
FIRST_HOST = 10  # host i is .(FIRST_HOST + i); .1 is the infrastructure side


def subnet() -> ipaddress.IPv4Network:
    override = os.environ.get("EVALSTREAM_HOSTS_SUBNET")
    if override:
        net = ipaddress.IPv4Network(override, strict=True)
        if net.prefixlen != 24 or not net.is_private:
            raise SystemExit(f"[stack] EVALSTREAM_HOSTS_SUBNET={override}: expected a private /24")
        return net
    return ipaddress.IPv4Network(f"10.231.{OFFSET // 100 % 256}.0/24")


def gateway() -> str:
    """The infrastructure's address on the hosts' network (the bridge's)."""
    return str(subnet().network_address + 1)


def bridge() -> str:
    return f"es{OFFSET}br"  # interface names are at most 15 characters


@dataclass(frozen=True)
class Host:
    index: int  # 1-based

    @property
    def name(self) -> str:
        return f"host{self.index}"

    @property
    def netns(self) -> str:
        return f"evalstream-{OFFSET}-{self.name}"

    @property
    def veth(self) -> str:
        """The host-side end of its link (on the bridge); inside the namespace it is eth0."""
        return f"es{OFFSET}h{self.index}"

    @property
    def address(self) -> str:
        return str(subnet().network_address + FIRST_HOST + self.index)

    @property
    def group(self) -> str:
        """The worker group its workers form (a group per machine, as a GPU box would be)."""
        return self.name

    def exec_argv(self, argv: list[str]) -> list[str]:
        """`argv` run inside the host (ip netns exec keeps the pid: it execs the program)."""
        return ["ip", "netns", "exec", self.netns, *argv]


def hosts(n: int) -> list[Host]:
    return [Host(i) for i in range(1, n + 1)]


SERVICES_HOST = Host(0)  # the router's and the aggregator's, with --services-host


def _state() -> dict[str, object]:
    try:
        state = json.loads(STATE.read_text())
        return state if isinstance(state, dict) else {}
    except (OSError, ValueError):
        return {}


def configured() -> int:
    """The number of worker hosts the stack was last brought up with (0: none)."""
    try:
        return int(str(_state().get("hosts", 0)))
    except ValueError:
        return 0


def services_host_configured() -> bool:
    return configured() > 0 and bool(_state().get("services_host"))


def save(n: int, services_host: bool, details: dict[str, object]) -> None:
    STACK.mkdir(parents=True, exist_ok=True)
    tmp = STATE.with_suffix(".tmp")
    tmp.write_text(json.dumps({"hosts": n, "services_host": services_host, **details}, indent=2) + "\n")
    tmp.replace(STATE)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, text=True, capture_output=True)


def _exists(kind: str, name: str) -> bool:
    if kind == "netns":
        return name in _ip("netns", "list").stdout.split()
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def _check_free() -> None:
    """Refuses a /24 that a route of the machine (other than our bridge's) already covers."""
    routes = json.loads(_ip("-j", "route", "show", "table", "all").stdout or "[]")
    net = subnet()
    for r in routes:
        dst, dev = r.get("dst", ""), r.get("dev", "")
        if dev == bridge() or dst in ("", "default") or ":" in dst or r.get("type") in ("local", "broadcast"):
            continue
        try:
            if ipaddress.IPv4Network(dst, strict=False).overlaps(net):
                raise SystemExit(
                    f"[stack] the hosts' network {net} overlaps the route {dst} dev {dev}; "
                    "choose another with EVALSTREAM_HOSTS_SUBNET"
                )
        except ValueError:
            continue


def create(n: int, services_host: bool = False) -> list[Host]:
    """The bridge with the infrastructure's address, and hosts 1..n (and host0 for the
    services), idempotent; other hosts, left from an earlier `up`, are removed."""
    if os.geteuid() != 0:
        raise SystemExit("[stack] --hosts needs root (network namespaces and veth links)")
    net = subnet()
    if not _exists("link", bridge()):
        _check_free()
        log(f"creating the hosts' network {net} (bridge {bridge()}, infrastructure at {gateway()})")
        _ip("link", "add", bridge(), "type", "bridge")
        _ip("addr", "add", f"{gateway()}/{net.prefixlen}", "dev", bridge())
    _ip("link", "set", bridge(), "up")
    wanted = ([SERVICES_HOST] if services_host else []) + hosts(n)
    for host in wanted:
        if not _exists("netns", host.netns):
            _ip("netns", "add", host.netns)
        if not _exists("link", host.veth):
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            _ip("link", "set", host.veth, "master", bridge())
            _ip("-n", host.netns, "addr", "add", f"{host.address}/{net.prefixlen}", "dev", "eth0")
        _ip("link", "set", host.veth, "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
    for extra in _existing_hosts():
        if extra not in wanted:
            remove_host(extra)
    return wanted


def _existing_hosts() -> list[Host]:
    prefix = f"evalstream-{OFFSET}-host"
    out = []
    for name in _ip("netns", "list").stdout.split():
        if name.startswith(prefix) and name.removeprefix(prefix).isdigit():
            out.append(Host(int(name.removeprefix(prefix))))
    return out


def _host_links() -> list[str]:
    prefix = f"es{OFFSET}h"
    links = json.loads(_ip("-j", "link", "show").stdout or "[]")
    return [
        link["ifname"]
        for link in links
        if link.get("ifname", "").startswith(prefix) and link["ifname"].removeprefix(prefix).isdigit()
    ]


def remove_host(host: Host) -> None:
    if _exists("netns", host.netns):
        _ip("netns", "del", host.netns)  # takes its end of the veth pair, and so the pair
    if _exists("link", host.veth):
        _ip("link", "del", host.veth)


def destroy() -> None:
    """Every namespace, link and address of this stack's hosts' network."""
    removed = [h.name for h in _existing_hosts()]
    for host in _existing_hosts():
        remove_host(host)
    for name in _host_links():  # a veth whose namespace vanished some other way
        _ip("link", "del", name)
    if _exists("link", bridge()):
        _ip("link", "del", bridge())
        removed.append(bridge())
    if removed:
        log(f"removed the hosts' network: {', '.join(removed)}")


def set_link(host: Host, up: bool) -> None:
    """A host's link up or down: down is a network partition of that host from everything."""
    if not _exists("link", host.veth):
        raise SystemExit(f"[stack] {host.name} has no link ({host.veth}): is the stack up with --hosts?")
    _ip("link", "set", host.veth, "up" if up else "down")


def link_up(host: Host) -> bool:
    flags = json.loads(_ip("-j", "link", "show", "dev", host.veth).stdout)[0].get("flags", [])
    return "UP" in flags


def pid_in_host(pid: int, host: Host) -> bool:
    """Whether a process runs in the host's network namespace (not the machine's)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(Path("/run/netns") / host.netns).st_ino
    except OSError:
        return False
