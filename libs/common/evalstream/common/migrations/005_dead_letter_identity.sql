-- A dead letter's (partition, offset) names its record only while eval.dlq lives: a
-- recreated topic counts offsets from 0 again, and its letters collided with the old ones
-- (ON CONFLICT DO NOTHING dropped them). The record's timestamp tells the two apart; a
-- redelivered record keeps it, so redelivery is still recorded once.
ALTER TABLE dead_letters ADD COLUMN dlq_timestamp bigint NOT NULL DEFAULT 0;
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_dlq_partition_dlq_offset_key;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_dlq_record UNIQUE (dlq_partition, dlq_offset, dlq_timestamp);
