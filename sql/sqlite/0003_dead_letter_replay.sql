-- The same as sql/mysql/0003_dead_letter_replay.sql.
ALTER TABLE dead_letters ADD COLUMN replayed_at DATETIME NULL;
