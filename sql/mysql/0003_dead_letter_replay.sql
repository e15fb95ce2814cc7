-- A dead letter an operator replayed: the order went back through the
-- purchase script and the pipeline, so this row no longer ends it.
ALTER TABLE dead_letters ADD COLUMN replayed_at DATETIME(3) NULL;
