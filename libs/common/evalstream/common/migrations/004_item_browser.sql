-- Issue 18: the report lists the items. Each result keeps what a reader needs to judge it
-- (bounded by the worker: question, gold, the prompt as rendered, the grader's detail and
-- evidence such as a code test's output), and an outcome rank that orders wrong and failed
-- items first; the indexes serve every page of the item browser's filters by keyset.
ALTER TABLE item_results
    ADD COLUMN question text,
    ADD COLUMN gold     text,
    ADD COLUMN prompt   text,
    ADD COLUMN detail   text,
    ADD COLUMN evidence text,
    -- 0 failed, 1 wrong, 2 ungraded, 3 right (evalstream.common.items.OUTCOMES)
    ADD COLUMN outcome  smallint GENERATED ALWAYS AS (
        CASE WHEN error IS NOT NULL THEN 0 WHEN correct IS FALSE THEN 1 WHEN correct IS NULL THEN 2 ELSE 3 END
    ) STORED;
CREATE INDEX item_results_outcome ON item_results (run_id, outcome, item_id);
CREATE INDEX item_results_category ON item_results (run_id, category, outcome, item_id);
CREATE INDEX item_results_served_by ON item_results (run_id, served_by, outcome, item_id);
