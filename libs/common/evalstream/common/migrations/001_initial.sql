-- Runs, their per-item results, dead letters and the shared answer cache.
CREATE TABLE runs (
    run_id          text PRIMARY KEY,
    name            text,
    status          text NOT NULL,         -- validating | rejected | running | completed
    model           text NOT NULL,
    grader          text NOT NULL,
    spec            jsonb NOT NULL,        -- the job as submitted
    manifest        jsonb,                 -- everything needed to reproduce the run
    manifest_sha256 text,
    dataset_uri     text,
    dataset_sha256  text,
    total           integer,
    shard_count     integer,
    problems        jsonb,                 -- why a run was rejected
    summary         jsonb,                 -- the report, once completed
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    completed_at    timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE item_results (
    run_id            text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    item_id           text NOT NULL,
    shard_id          text NOT NULL,
    response          text,
    extracted         text,
    correct           boolean,
    score             double precision NOT NULL DEFAULT 0,
    error             text,
    attempts          integer NOT NULL DEFAULT 1,
    cache_hit         boolean NOT NULL DEFAULT false,
    latency_ms        double precision NOT NULL DEFAULT 0,
    served_by         text NOT NULL DEFAULT '',
    prompt_tokens     integer NOT NULL DEFAULT 0,
    completion_tokens integer NOT NULL DEFAULT 0,
    truncated         boolean NOT NULL DEFAULT false,
    category          text,
    recorded_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, item_id)          -- the natural key: one row per item, ever
);
CREATE INDEX item_results_shard ON item_results (run_id, shard_id);

CREATE TABLE dead_letters (
    id                 bigserial PRIMARY KEY,
    run_id             text,
    item_id            text,
    original_topic     text,
    original_partition integer,
    original_offset    bigint,
    dlq_partition      integer NOT NULL,
    dlq_offset         bigint NOT NULL,
    error              text,
    headers            jsonb NOT NULL,
    payload            bytea NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    redriven_at        timestamptz,
    UNIQUE (dlq_partition, dlq_offset)     -- a redelivered dead letter is recorded once
);
CREATE INDEX dead_letters_run ON dead_letters (run_id);

CREATE TABLE answer_cache (
    key               text PRIMARY KEY,    -- keys.cache_key(): model, weights, params, prompt
    model             text NOT NULL,
    response          text NOT NULL,
    prompt_tokens     integer NOT NULL,
    completion_tokens integer NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now()
);
