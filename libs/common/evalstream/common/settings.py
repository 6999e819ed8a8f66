"""Configuration from environment variables, declared once: each field below is read from
the variable of its name in upper case (`kafka_bootstrap` <- KAFKA_BOOTSTRAP), converted to
its declared type, with the declared default (the local stack's).

Settings come in groups, and each service reads only its own (`WorkerSettings.from_env()`
in the worker, and so on): a group is the dataclass of the fields it declares plus those of
the groups it builds on. `Settings` holds every group, for the CLI, the tests and the
benchmarks. Every variable the code reads goes through here (`DEFAULTS` lists them).

The same variable names are used by docker-compose.yml, the local stack (`make up`) and
tests; `tests/unit/test_compose_env.py` keeps the three in agreement.
"""

from __future__ import annotations

import os
import socket
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Self

from evalstream.common.specs import DEFAULT_MODEL, DEFAULT_MODEL_HF, DEFAULT_MODEL_OV, parse_model_spec


def _boolean(raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


_CONVERTERS: dict[Any, Callable[[str], Any]] = {str: str, int: int, float: float, bool: _boolean}


@dataclass(frozen=True)
class _Group:
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The group's values from `environ` (default: the process environment); a
        variable that is not set keeps its default. Raises ValueError on a bad value."""
        env = os.environ if environ is None else environ
        types = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = f.name.upper()
            if name in env:
                try:
                    values[f.name] = _CONVERTERS[types[f.name]](env[name])
                except ValueError as exc:
                    raise ValueError(f"environment variable {name}={env[name]!r}: {exc}") from exc
        return cls(**values)

    @classmethod
    def variables(cls) -> dict[str, str]:
        """Every variable of the group, with its default as text."""
        return {f.name.upper(): _text(f.default) for f in fields(cls)}


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --------------------------------------------------------------------------- shared groups


@dataclass(frozen=True)
class TopicSettings(_Group):
    # Prefix of every topic and consumer group name (topics.py): a pipeline of its own on a
    # shared broker, as the tracing test runs one.
    kafka_topic_prefix: str = ""
    # Partitions per topic (topics.py). A consumer group uses at most as many members as its
    # topic has partitions: KAFKA_PARTITIONS_WORK bounds the workers of one group, _SHARDS the
    # routers, _RESULTS the aggregators. Bootstrap raises the count of an existing topic
    # when a setting grows (Kafka never lowers one).
    kafka_partitions_jobs: int = 3
    kafka_partitions_shards: int = 6
    kafka_partitions_work: int = 6
    kafka_partitions_results: int = 6
    kafka_partitions_retry: int = 3
    kafka_partitions_dlq: int = 3


@dataclass(frozen=True)
class KafkaSettings(TopicSettings):
    kafka_bootstrap: str = "127.0.0.1:9092"
    # How clients authenticate (kafka_security.py turns these into client arguments):
    # PLAINTEXT (no authentication) | SASL_PLAINTEXT | SASL_SSL; SASL mechanism
    # SCRAM-SHA-512 | SCRAM-SHA-256 | PLAIN; the principal and its password.
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str = "SCRAM-SHA-512"
    kafka_username: str = ""
    kafka_password: str = field(default="", repr=False)
    kafka_ssl_cafile: str = ""  # SASL_SSL: the CA bundle that signed the broker's cert (empty: system's)


@dataclass(frozen=True)
class TelemetrySettings(_Group):
    # OTLP/HTTP collector for traces (telemetry.py); empty: no export. The exporter reads
    # the other OTEL_* variables (headers, timeout) itself.
    otel_exporter_otlp_endpoint: str = ""
    otel_exporter_otlp_traces_endpoint: str = ""  # traces only; wins over the one above
    otel_sdk_disabled: bool = False  # true: no spans at all


@dataclass(frozen=True)
class ServiceSettings(KafkaSettings, TelemetrySettings):
    """What every service reads: the broker, its HTTP port (healthz, readyz, metrics), logs."""

    http_host: str = "127.0.0.1"
    http_port: int = 0
    log_level: str = "INFO"
    # A message whose handler fails this many times (not counting failures during an outage
    # of the service's dependencies) is dead-lettered instead of handled again (poison.py).
    consumer_max_failures: int = 3


@dataclass(frozen=True)
class DatabaseSettings(_Group):
    database_url: str = field(
        default="postgresql://evalstream:evalstream@127.0.0.1:5432/evalstream", repr=False
    )


@dataclass(frozen=True)
class S3Settings(_Group):
    s3_endpoint: str = "http://127.0.0.1:8333"
    s3_access_key: str = "evalstream"
    s3_secret_key: str = field(default="evalstream-secret", repr=False)
    s3_region: str = "us-east-1"
    s3_bucket_datasets: str = "evalstream-datasets"
    s3_bucket_results: str = "evalstream-results"


@dataclass(frozen=True)
class TestHookSettings(_Group):
    """TEST-ONLY hooks (testhooks.py): never set in production."""

    # Crash points for the fault suite, e.g. "aggregator_exit_after_write=3" (exits without
    # committing, as a kill -9 between the database write and the offset commit would).
    fault_inject: str = ""
    engine_faults: str = ""  # engine fault injection, e.g. "transient=0.1,permanent=0.01,seed=7"
    engine_delay_ms: float = 0.0  # artificial per-item engine delay (benchmarks)


# Batch limits per (engine, device kind): what one engine call may hold, in (longest prompt +
# most new tokens) x rows and in rows (worker/batching.py). Measured with
# bench/batch_sweep.py (README, "Batching per engine and device"); BATCH_TOKEN_BUDGET and
# BATCH_MAX_ITEMS override them.
BATCH_LIMITS: dict[tuple[str, str], tuple[int, int]] = {
    # the seed's GPU figure, not re-measured (no GPU here)
    ("hf", "cuda"): (2048, 64),
    # transformers on the CPU: bigger static batches amortise the weights' reads per step
    ("hf", "cpu"): (16384, 128),
    # continuous batching schedules inside the call (OV_MAX_BATCHED_TOKENS per step): the
    # more requests it sees at once, the fuller its steps
    ("ov", "cpu"): (65536, 512),
}


@dataclass(frozen=True)
class WorkerGroupSettings(_Group):
    worker_group: str = "default"  # a worker's group; its work topic is eval.work.<group>


@dataclass(frozen=True)
class OpenAISettings(_Group):
    """The operator's defaults for `openai:` engines (worker/engines/openai/config.py); a SPEC's own
    options, then its provider preset's, come first. Also the engine's defaults."""

    openai_concurrency: int = 8
    openai_rps: float = 0.0  # 0: unpaced
    openai_rpm: float = 0.0
    openai_timeout_s: float = 60.0
    openai_max_retries: int = 6


@dataclass(frozen=True)
class SandboxSettings(_Group):
    # a cgroup v2 folder delegated to the worker, for the code sandbox's memory and pids
    # limits (worker/sandbox/cgroups.py); empty: rlimits and tmpfs caps only
    sandbox_cgroup: str = ""


@dataclass(frozen=True)
class GpuSettings(_Group):
    # as the CUDA runtime reads it: the GPU that CUDA calls device 0 is the first one named
    # (an index or a GPU- UUID), which NVML's gauges must read (worker/gpu.py)
    cuda_visible_devices: str = ""


@dataclass(frozen=True)
class ExportSettings(_Group):
    """`evalctl export`'s defaults (cli/export.py), under the trackers' own variable names."""

    wandb_project: str = "evalstream"
    wandb_entity: str = ""
    wandb_dir: str = "."
    mlflow_tracking_uri: str = "file:./mlruns"
    mlflow_experiment_name: str = "evalstream"


def named_variable(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """A variable that a setting names rather than this module (WORKER_API_KEYS maps each
    endpoint to the variable holding its key, chosen by the operator): the one read of the
    environment by a name not declared here. Empty reads as None."""
    env = os.environ if environ is None else environ
    return env.get(name) or None


# --------------------------------------------------------------------------- per service


@dataclass(frozen=True)
class WorkerSettings(
    ServiceSettings,
    DatabaseSettings,
    TestHookSettings,
    WorkerGroupSettings,
    OpenAISettings,
    SandboxSettings,
    GpuSettings,
):
    # the group's allow-list: comma-separated SPEC patterns it serves, models and judges alike
    # (the first SPEC that is no pattern loads at start: the bundled model's name, which a
    # worker serves with its device's fastest faithful engine, specs.FAITHFUL_ENGINES)
    worker_model: str = f"{DEFAULT_MODEL},{DEFAULT_MODEL_HF},{DEFAULT_MODEL_OV},null,replay:*"
    # which variable holds the API key of which endpoint: "<base-url pattern>=<VARIABLE>,..."
    # (worker/engines/openai/config.py); a job never names a variable
    worker_api_keys: str = ""
    # `replay:` files (models' and judges') are read only under this folder: regular files,
    # symlinks resolved and kept inside it, no `~`, at most 256 MiB (worker/engines/replay.py);
    # empty: no replay files at all
    replay_root: str = ""
    worker_id: str = ""  # empty: <group>-<hostname>-<pid>
    worker_max_shards: int = 16  # shards taken per engine round
    # A long engine batch must not get a worker evicted from its group (aiokafka 848/678).
    worker_max_poll_interval_ms: int = 3_600_000
    # A batch's (longest prompt + most new tokens) x rows, and its rows; 0: the measured
    # default of the engine and device (BATCH_LIMITS below), a value: that, for every engine.
    batch_token_budget: int = 0
    batch_max_wait_ms: int = 100
    batch_max_items: int = 0
    # The ov: engine's own scheduler (OpenVINO GenAI continuous batching; measured by
    # bench/batch_sweep.py): tokens per step, sequences at once, KV cache size in GB.
    ov_max_batched_tokens: int = 256
    ov_max_sequences: int = 256
    ov_kv_cache_gb: float = 2.0
    heartbeat_interval_s: float = 2.0
    model_cache_dir: str = ""  # empty: $XDG_CACHE_HOME/evalstream/models
    xdg_cache_home: str = ""  # empty: ~/.cache
    # The string graders run in this many child processes, each item under this deadline
    # and each process under this address-space limit (worker/grading_pool.py).
    grading_processes: int = 2
    grading_timeout_s: float = 5.0
    grading_memory_mb: int = 1024
    # A work message delivered this many times without its offset being committed (its
    # processing failed or overran the poll interval each time) is dead-lettered.
    worker_max_deliveries: int = 3

    @property
    def resolved_worker_id(self) -> str:
        # hostname: containers of one image all run as pid 1
        return self.worker_id or f"{self.worker_group}-{socket.gethostname()}-{os.getpid()}"

    def batch_limits(self, engine: str, device: str) -> tuple[int, int]:
        """(token budget, items) of one engine call for the engine serving SPEC `engine` on
        `device` (an engine's device label: "cpu", "cuda:0 (...)"): BATCH_TOKEN_BUDGET and
        BATCH_MAX_ITEMS where set, else the measured defaults in BATCH_LIMITS."""
        kind = "cuda" if device.startswith("cuda") else "cpu"
        try:
            scheme = parse_model_spec(engine).scheme
        except ValueError:
            scheme = "hf"
        budget, items = BATCH_LIMITS.get((scheme, kind), BATCH_LIMITS[("hf", kind)])
        return self.batch_token_budget or budget, self.batch_max_items or items

    @property
    def resolved_model_cache_dir(self) -> str:
        return self.model_cache_dir or os.path.join(
            self.xdg_cache_home or os.path.expanduser("~/.cache"), "evalstream", "models"
        )


@dataclass(frozen=True)
class RouterSettings(ServiceSettings):
    router_heartbeat_timeout_s: float = 15.0
    router_no_group_timeout_s: float = 120.0
    # A shard whose groups are all dead stops blocking its partition after this long: it is
    # parked on the retry topic and tried again, until ROUTER_PARK_TIMEOUT_S dead-letters it.
    router_park_after_s: float = 5.0
    router_park_timeout_s: float = 3600.0
    # weighted | least_outstanding | consistent_hash | round_robin (router/policy.py)
    router_policy: str = "weighted"
    router_weights: str = "lag=0.4,latency=0.3,gpu=0.15,memory=0.15"  # base weights of the score
    # outstanding shards per live member beyond which a group is saturated (back-pressure)
    router_max_lag: int = 32
    router_lag_interval_s: float = 1.0  # consumer-lag polling
    router_batch_records: int = 256  # shards per poll, forwarded together and committed once
    # ...and what one fetch may bring, in bytes (a poll holds what the fetcher buffered: up
    # to 1 MiB per partition). Shards are decoded one at a time as they are routed, not a
    # poll at once: a 256-item shard decoded takes about four times its bytes
    router_batch_bytes: int = 2 * 1024 * 1024
    router_groups: str = "*"  # worker groups this router uses (shell patterns)
    # input topics; empty: eval.shards / eval.retry; ROUTER_RETRY_TOPIC=none: no retries
    router_shards_topic: str = ""
    router_retry_topic: str = ""
    # a group dead this long has its pending shards moved to healthy groups; 0: never
    router_reroute_after_s: float = 60.0
    router_sla_p95_ms: float = 30000.0
    router_sla_max_error_rate: float = 0.05
    router_sla_tiers: str = "0.3,0.6"  # violation rates that step down a model
    router_fallback: str = ""  # lighter models, e.g. "hf:big=hf:small"
    # A starting router reads the heartbeats already on the topic before it routes or rescues
    # (its view of the fleet is partial until then); it waits at most this long for that.
    router_catch_up_s: float = 60.0


@dataclass(frozen=True)
class ProducerSettings(ServiceSettings, DatabaseSettings, S3Settings):
    evalstream_git_commit: str = ""  # the commit recorded in run manifests
    # Jobs read datasets from the datasets bucket; local files only under this folder (empty:
    # none), and no dataset larger than DATASET_MAX_BYTES (intake_limits.py).
    dataset_local_root: str = ""
    dataset_max_bytes: int = 268_435_456
    # Processes that check a large JSON Lines dataset (datasets/parts.py); 1: the producer's
    # own thread only. Checking is about 7 µs of CPU per short item (150,000 in 1.0 s).
    dataset_check_processes: int = 2


@dataclass(frozen=True)
class AggregatorSettings(ServiceSettings, DatabaseSettings, S3Settings, TestHookSettings):
    # A results window (aggregator/sink.py) closes at this many records, or once the broker
    # has this many bytes for it, or after this long: one transaction, Parquet rewrite and
    # Delta commit per window, and results of a slow run still appear within the time bound.
    # The bytes also bound a window's memory (a fast run's backlog fills every window alike).
    aggregator_window_records: int = 2000
    aggregator_window_bytes: int = 4 * 1024 * 1024
    aggregator_window_ms: int = 500
    # The Delta table's upkeep (delete expired log files, vacuum replaced files; delta.py
    # `maintain`) runs after a run's compaction, at most once per this many seconds.
    aggregator_delta_maintenance_s: float = 3600.0


@dataclass(frozen=True)
class BootstrapSettings(KafkaSettings, DatabaseSettings, S3Settings, WorkerGroupSettings):
    worker_groups: str = ""  # work topics to create (comma-separated); empty: WORKER_GROUP's


@dataclass(frozen=True)
class Settings(
    WorkerSettings, RouterSettings, ProducerSettings, AggregatorSettings, BootstrapSettings, ExportSettings
):
    """Every group: for the CLI, the tests and the benchmarks, which talk to all services."""


# Every environment variable the services read, with its local default.
DEFAULTS: dict[str, str] = Settings.variables()

# The HTTP port each service listens on locally (healthz, readyz, metrics). The local
# stack gives its n-th worker SERVICE_PORTS["worker"] + n.
SERVICE_PORTS: dict[str, int] = {
    "producer": 8101,
    "router": 8102,
    "aggregator": 8104,
    "worker": 8110,
}
