-- One run spread over several aggregators, and a sink that writes windows, not shards.
--
-- ordinal: the row's place among its run's rows, in order of recording (per run, from
--   runs.next_ordinal, allocated in the writing transaction; a replaced failure keeps its
--   ordinal). The run's Parquet files in S3 are segments of ordinals (aggregator/objects.py),
--   each rewritten from these rows whenever it changes, so a rewrite is idempotent.
-- source: the Kafka record ("topic:partition:offset") whose result the row holds now. A
--   window redone after a crash finds its rows by it, so that the Delta table, whose commits
--   carry the offsets they cover, gets each record's rows exactly once (aggregator/delta.py).
ALTER TABLE runs ADD COLUMN next_ordinal bigint NOT NULL DEFAULT 0;
ALTER TABLE item_results ADD COLUMN ordinal bigint;
ALTER TABLE item_results ADD COLUMN source text;
UPDATE item_results i SET ordinal = o.n - 1
FROM (SELECT run_id, item_id, row_number() OVER (PARTITION BY run_id ORDER BY item_id) AS n FROM item_results) o
WHERE i.run_id = o.run_id AND i.item_id = o.item_id;
UPDATE runs SET next_ordinal = (SELECT count(*) FROM item_results i WHERE i.run_id = runs.run_id);
ALTER TABLE item_results ALTER COLUMN ordinal SET NOT NULL;
-- segments are read by ordinal; nothing reads by shard any more
CREATE INDEX item_results_ordinal ON item_results (run_id, ordinal);
DROP INDEX item_results_shard;
