"""Toxiproxy, the fault proxy between hosts and the broker (`up --hosts N`).

One proxy, `kafka`, listens on the hosts' network and forwards to Kafka's PROXIED listener,
which advertises the proxy's address (localstack/kafka.py): a host whose KAFKA_BOOTSTRAP is
the proxy's address reaches the broker only through it, for every connection. Without
toxics the proxy passes bytes unchanged; the fault suite adds latency, jitter, bandwidth
limits, slicing and dropped connections through its HTTP API (loopback only) and removes
them afterwards. No netem qdisc is needed (this kernel has none).
"""

from __future__ import annotations

import json

from localstack import hosts
from localstack.config import KAFKA_PROXIED_PORT, PROXY_KAFKA_PORT, STACK, TOXIPROXY_PORT, http_ok
from localstack.installs import toxiproxy_binary


def proxied_kafka_bootstrap() -> str:
    return f"{hosts.gateway()}:{PROXY_KAFKA_PORT}"


def toxiproxy_url() -> str:
    return f"http://127.0.0.1:{TOXIPROXY_PORT}"


def toxiproxy_prepare() -> None:
    d = STACK / "toxiproxy"
    d.mkdir(parents=True, exist_ok=True)
    proxies = [
        {
            "name": "kafka",
            "listen": proxied_kafka_bootstrap(),
            "upstream": f"127.0.0.1:{KAFKA_PROXIED_PORT}",
            "enabled": True,
        }
    ]
    (d / "proxies.json").write_text(json.dumps(proxies, indent=2) + "\n")


def toxiproxy_argv() -> list[str]:
    return [
        str(toxiproxy_binary()),
        "-host",
        "127.0.0.1",
        "-port",
        str(TOXIPROXY_PORT),
        "-config",
        str(STACK / "toxiproxy" / "proxies.json"),
    ]


def toxiproxy_healthy() -> bool:
    return http_ok(f"{toxiproxy_url()}/proxies/kafka")
