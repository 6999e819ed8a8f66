-- A run's result count, kept in step with item_results inside the aggregator's write
-- transaction, so that progress and completion checks read one row instead of counting
-- every result of the run after every batch (quadratic over a 150k-item run).
ALTER TABLE runs ADD COLUMN recorded integer NOT NULL DEFAULT 0;
UPDATE runs SET recorded = (SELECT count(*) FROM item_results i WHERE i.run_id = runs.run_id);
