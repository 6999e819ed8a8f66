-- Issue 24: log-likelihood scoring (graders `loglikelihood` and `perplexity`,
-- evalstream.common.scoring). Each choice's log-likelihood is the item's response (JSON) and
-- the grader's reading of it its evidence; these columns are what a run's summary aggregates:
-- acc_norm per item, the log-likelihood of the gold continuation (perplexity of a
-- one-continuation task) or of the whole document, and the document's words and UTF-8 bytes
-- (lm-eval's word_perplexity, byte_perplexity and bits_per_byte weights).
ALTER TABLE item_results
    ADD COLUMN correct_norm  boolean,
    ADD COLUMN loglikelihood float8,
    ADD COLUMN doc_words     int4,
    ADD COLUMN doc_bytes     int8;
