"""Configuration from environment variables, with defaults that match the local stack.

The same variable names are used by docker-compose.yml, the local stack (`make up`) and
tests; `tests/unit/test_compose.py` keeps the three in agreement.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, fields

# Every environment variable the services read, with its local default.
DEFAULTS: dict[str, str] = {
    "KAFKA_BOOTSTRAP": "127.0.0.1:9092",
    "DATABASE_URL": "postgresql://evalstream:evalstream@127.0.0.1:5432/evalstream",
    "S3_ENDPOINT": "http://127.0.0.1:8333",
    "S3_ACCESS_KEY": "evalstream",
    "S3_SECRET_KEY": "evalstream-secret",
    "S3_REGION": "us-east-1",
    "S3_BUCKET_DATASETS": "evalstream-datasets",
    "S3_BUCKET_RESULTS": "evalstream-results",
    "HTTP_HOST": "127.0.0.1",
    "HTTP_PORT": "0",
    "WORKER_GROUP": "default",
    "WORKER_MODEL": "hf:smollm2-135m-instruct,null,replay:*",
    "WORKER_ID": "",
    "WORKER_GROUPS": "",
    "WORKER_MAX_SHARDS": "16",
    "ENGINE_FAULTS": "",
    "ROUTER_HEARTBEAT_TIMEOUT_S": "15",
    "ROUTER_NO_GROUP_TIMEOUT_S": "120",
    "BATCH_TOKEN_BUDGET": "2048",
    "BATCH_MAX_WAIT_MS": "100",
    "BATCH_MAX_ITEMS": "64",
    "MAX_ATTEMPTS": "3",
    "RETRY_BASE_DELAY_S": "1.0",
    "HEARTBEAT_INTERVAL_S": "2.0",
    "MODEL_CACHE_DIR": "",
    "LOG_LEVEL": "INFO",
}

# The HTTP port each service listens on locally (healthz, readyz, metrics). The local
# stack gives its n-th worker SERVICE_PORTS["worker"] + n.
SERVICE_PORTS: dict[str, int] = {
    "producer": 8101,
    "router": 8102,
    "aggregator": 8104,
    "worker": 8110,
}


_CONVERTERS: dict[str, type] = {"str": str, "int": int, "float": float}


def _env(name: str) -> str:
    return os.environ.get(name, DEFAULTS[name])


@dataclass(frozen=True)
class Settings:
    kafka_bootstrap: str = DEFAULTS["KAFKA_BOOTSTRAP"]
    database_url: str = DEFAULTS["DATABASE_URL"]
    s3_endpoint: str = DEFAULTS["S3_ENDPOINT"]
    s3_access_key: str = DEFAULTS["S3_ACCESS_KEY"]
    s3_secret_key: str = field(default=DEFAULTS["S3_SECRET_KEY"], repr=False)
    s3_region: str = DEFAULTS["S3_REGION"]
    s3_bucket_datasets: str = DEFAULTS["S3_BUCKET_DATASETS"]
    s3_bucket_results: str = DEFAULTS["S3_BUCKET_RESULTS"]
    http_host: str = DEFAULTS["HTTP_HOST"]
    http_port: int = int(DEFAULTS["HTTP_PORT"])
    worker_group: str = DEFAULTS["WORKER_GROUP"]
    worker_model: str = DEFAULTS["WORKER_MODEL"]  # comma-separated SPEC patterns this group serves
    worker_id: str = DEFAULTS["WORKER_ID"]
    worker_groups: str = DEFAULTS["WORKER_GROUPS"]  # bootstrap: work topics to create (comma-separated)
    worker_max_shards: int = int(DEFAULTS["WORKER_MAX_SHARDS"])  # shards taken per engine round
    engine_faults: str = DEFAULTS["ENGINE_FAULTS"]  # fault injection for tests, e.g. "transient=0.1"
    router_heartbeat_timeout_s: float = float(DEFAULTS["ROUTER_HEARTBEAT_TIMEOUT_S"])
    router_no_group_timeout_s: float = float(DEFAULTS["ROUTER_NO_GROUP_TIMEOUT_S"])
    batch_token_budget: int = int(DEFAULTS["BATCH_TOKEN_BUDGET"])
    batch_max_wait_ms: int = int(DEFAULTS["BATCH_MAX_WAIT_MS"])
    batch_max_items: int = int(DEFAULTS["BATCH_MAX_ITEMS"])
    max_attempts: int = int(DEFAULTS["MAX_ATTEMPTS"])
    retry_base_delay_s: float = float(DEFAULTS["RETRY_BASE_DELAY_S"])
    heartbeat_interval_s: float = float(DEFAULTS["HEARTBEAT_INTERVAL_S"])
    model_cache_dir: str = DEFAULTS["MODEL_CACHE_DIR"]
    log_level: str = DEFAULTS["LOG_LEVEL"]

    @classmethod
    def from_env(cls) -> Settings:
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = _env(f.name.upper())
            convert = _CONVERTERS[str(f.type)]
            try:
                values[f.name] = convert(raw)
            except ValueError as exc:
                raise ValueError(f"environment variable {f.name.upper()}={raw!r}: {exc}") from exc
        return cls(**values)  # type: ignore[arg-type]

    @property
    def resolved_worker_id(self) -> str:
        # hostname: containers of one image all run as pid 1
        return self.worker_id or f"{self.worker_group}-{socket.gethostname()}-{os.getpid()}"

    @property
    def resolved_model_cache_dir(self) -> str:
        return self.model_cache_dir or os.path.join(
            os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "evalstream", "models"
        )
