"""Configuration from environment variables, with defaults that match the local stack.

The same variable names are used by docker-compose.yml, the local stack (`make up`) and
tests; `tests/unit/test_compose.py` keeps the three in agreement.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, fields

from evalstream.common.specs import DEFAULT_MODEL

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
    "WORKER_MODEL": f"{DEFAULT_MODEL},null,replay:*",
    "WORKER_API_KEYS": "",
    "WORKER_ID": "",
    "WORKER_GROUPS": "",
    "WORKER_MAX_SHARDS": "16",
    "ENGINE_FAULTS": "",
    "FAULT_INJECT": "",
    "WORKER_MAX_POLL_INTERVAL_MS": "3600000",
    "ROUTER_HEARTBEAT_TIMEOUT_S": "15",
    "ROUTER_NO_GROUP_TIMEOUT_S": "120",
    "ROUTER_PARK_AFTER_S": "5",
    "ROUTER_PARK_TIMEOUT_S": "3600",
    "ROUTER_POLICY": "weighted",
    "ROUTER_WEIGHTS": "lag=0.4,latency=0.3,gpu=0.15,memory=0.15",
    "ROUTER_MAX_LAG": "32",
    "ROUTER_LAG_INTERVAL_S": "1.0",
    "ROUTER_GROUPS": "*",
    "ROUTER_SHARDS_TOPIC": "",
    "ROUTER_RETRY_TOPIC": "",
    "ROUTER_REROUTE_AFTER_S": "60",
    "ROUTER_SLA_P95_MS": "30000",
    "ROUTER_SLA_MAX_ERROR_RATE": "0.05",
    "ROUTER_SLA_TIERS": "0.3,0.6",
    "ROUTER_FALLBACK": "",
    "ENGINE_DELAY_MS": "0",
    "BATCH_TOKEN_BUDGET": "2048",
    "BATCH_MAX_WAIT_MS": "100",
    "BATCH_MAX_ITEMS": "64",
    "HEARTBEAT_INTERVAL_S": "2.0",
    "MODEL_CACHE_DIR": "",
    "LOG_LEVEL": "INFO",
    "KAFKA_TOPIC_PREFIX": "",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "",
    # a cgroup v2 folder delegated to the worker, for the code sandbox's memory and pids
    # limits (worker/sandbox.py); empty: rlimits and tmpfs caps only
    "SANDBOX_CGROUP": "",
    # Bounded grading and intake (issue 12): see the fields below.
    "GRADING_PROCESSES": "2",
    "GRADING_TIMEOUT_S": "5",
    "GRADING_MEMORY_MB": "1024",
    "WORKER_MAX_DELIVERIES": "3",
    "DATASET_LOCAL_ROOT": "",
    "DATASET_MAX_BYTES": "268435456",
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
    # the group's allow-list: comma-separated SPEC patterns it serves, models and judges alike
    worker_model: str = DEFAULTS["WORKER_MODEL"]
    # which variable holds the API key of which endpoint: "<base-url pattern>=<VARIABLE>,..."
    # (worker/engines/openai.py); a job never names a variable
    worker_api_keys: str = DEFAULTS["WORKER_API_KEYS"]
    worker_id: str = DEFAULTS["WORKER_ID"]
    worker_groups: str = DEFAULTS["WORKER_GROUPS"]  # bootstrap: work topics to create (comma-separated)
    worker_max_shards: int = int(DEFAULTS["WORKER_MAX_SHARDS"])  # shards taken per engine round
    engine_faults: str = DEFAULTS["ENGINE_FAULTS"]  # fault injection for tests, e.g. "transient=0.1"
    # Crash points for the fault suite, e.g. "aggregator_exit_after_write=3" (exits without
    # committing, as a kill -9 between the database write and the offset commit would).
    fault_inject: str = DEFAULTS["FAULT_INJECT"]
    # A long engine batch must not get a worker evicted from its group (aiokafka 848/678).
    worker_max_poll_interval_ms: int = int(DEFAULTS["WORKER_MAX_POLL_INTERVAL_MS"])
    router_heartbeat_timeout_s: float = float(DEFAULTS["ROUTER_HEARTBEAT_TIMEOUT_S"])
    router_no_group_timeout_s: float = float(DEFAULTS["ROUTER_NO_GROUP_TIMEOUT_S"])
    # A shard whose groups are all dead stops blocking its partition after this long: it is
    # parked on the retry topic and tried again, until ROUTER_PARK_TIMEOUT_S dead-letters it.
    router_park_after_s: float = float(DEFAULTS["ROUTER_PARK_AFTER_S"])
    router_park_timeout_s: float = float(DEFAULTS["ROUTER_PARK_TIMEOUT_S"])
    # weighted | least_outstanding | consistent_hash | round_robin (router/policy.py)
    router_policy: str = DEFAULTS["ROUTER_POLICY"]
    router_weights: str = DEFAULTS["ROUTER_WEIGHTS"]  # base weights of the weighted score
    # outstanding shards per live member beyond which a group is saturated (back-pressure)
    router_max_lag: int = int(DEFAULTS["ROUTER_MAX_LAG"])
    router_lag_interval_s: float = float(DEFAULTS["ROUTER_LAG_INTERVAL_S"])  # consumer-lag polling
    router_groups: str = DEFAULTS["ROUTER_GROUPS"]  # worker groups this router uses (shell patterns)
    # input topics; empty: eval.shards / eval.retry; ROUTER_RETRY_TOPIC=none: no retries
    router_shards_topic: str = DEFAULTS["ROUTER_SHARDS_TOPIC"]
    router_retry_topic: str = DEFAULTS["ROUTER_RETRY_TOPIC"]
    # a group dead this long has its pending shards moved to healthy groups; 0: never
    router_reroute_after_s: float = float(DEFAULTS["ROUTER_REROUTE_AFTER_S"])
    router_sla_p95_ms: float = float(DEFAULTS["ROUTER_SLA_P95_MS"])
    router_sla_max_error_rate: float = float(DEFAULTS["ROUTER_SLA_MAX_ERROR_RATE"])
    router_sla_tiers: str = DEFAULTS["ROUTER_SLA_TIERS"]  # violation rates that step down a model
    router_fallback: str = DEFAULTS["ROUTER_FALLBACK"]  # lighter models, e.g. "hf:big=hf:small"
    engine_delay_ms: float = float(DEFAULTS["ENGINE_DELAY_MS"])  # artificial per-item delay (benchmarks)
    batch_token_budget: int = int(DEFAULTS["BATCH_TOKEN_BUDGET"])
    batch_max_wait_ms: int = int(DEFAULTS["BATCH_MAX_WAIT_MS"])
    batch_max_items: int = int(DEFAULTS["BATCH_MAX_ITEMS"])
    heartbeat_interval_s: float = float(DEFAULTS["HEARTBEAT_INTERVAL_S"])
    model_cache_dir: str = DEFAULTS["MODEL_CACHE_DIR"]
    log_level: str = DEFAULTS["LOG_LEVEL"]
    # Prefix of every topic and consumer group name (topics.py): a pipeline of its own on a
    # shared broker, as the tracing test runs one.
    kafka_topic_prefix: str = DEFAULTS["KAFKA_TOPIC_PREFIX"]
    # OTLP/HTTP collector for traces (telemetry.py); empty: no export.
    otel_exporter_otlp_endpoint: str = DEFAULTS["OTEL_EXPORTER_OTLP_ENDPOINT"]
    # The worker's string graders run in this many child processes, each item under this
    # deadline and each process under this address-space limit (worker/grading_pool.py).
    grading_processes: int = int(DEFAULTS["GRADING_PROCESSES"])
    grading_timeout_s: float = float(DEFAULTS["GRADING_TIMEOUT_S"])
    grading_memory_mb: int = int(DEFAULTS["GRADING_MEMORY_MB"])
    # A work message delivered this many times without its offset being committed (its
    # processing failed or overran the poll interval each time) is dead-lettered.
    worker_max_deliveries: int = int(DEFAULTS["WORKER_MAX_DELIVERIES"])
    # Jobs read datasets from the datasets bucket; local files only under this folder (empty:
    # none), and no dataset larger than DATASET_MAX_BYTES.
    dataset_local_root: str = DEFAULTS["DATASET_LOCAL_ROOT"]
    dataset_max_bytes: int = int(DEFAULTS["DATASET_MAX_BYTES"])

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
