-- Dataset versions and the model revision behind every answer (issue 9: reproducible runs).

-- A dataset version is its content: the order- and format-independent content_sha256 of
-- its items (questions, gold answers, choices, ...). The same content under another file
-- name is the same version; a changed label is a new one.
CREATE TABLE dataset_versions (
    content_sha256 text PRIMARY KEY,
    name           text NOT NULL,               -- the file name it was first submitted as
    names          text[] NOT NULL DEFAULT '{}', -- every file name it was submitted as
    items          integer NOT NULL,
    uri            text NOT NULL,               -- the content-addressed copy in S3
    first_run_id   text,                        -- the run that brought it in (runs may be deleted)
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dataset_versions_name ON dataset_versions (name, created_at);
CREATE INDEX runs_dataset ON runs (dataset_sha256);

-- What actually served each answer: the engine's revision (weights or answer-file hash).
ALTER TABLE item_results ADD COLUMN model_revision text NOT NULL DEFAULT '';

-- The versions of the runs that came before this table.
INSERT INTO dataset_versions (content_sha256, name, names, items, uri, first_run_id, created_at)
SELECT dataset_sha256,
       (array_agg(regexp_replace(dataset_uri, '^.*/', '') ORDER BY created_at))[1],
       array_agg(DISTINCT regexp_replace(dataset_uri, '^.*/', '')),
       max(total),
       (array_agg(manifest->'dataset'->>'uri' ORDER BY created_at))[1],
       (array_agg(run_id ORDER BY created_at))[1],
       min(created_at)
FROM runs
WHERE dataset_sha256 IS NOT NULL AND total IS NOT NULL AND manifest->'dataset'->>'uri' IS NOT NULL
GROUP BY dataset_sha256;
