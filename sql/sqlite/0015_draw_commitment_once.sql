-- The same as sql/mysql/0015_draw_commitment_once.sql, in SQLite's dialect.
CREATE TRIGGER trg_vouchers_draw_commitment_once BEFORE UPDATE OF draw_commitment ON vouchers WHEN OLD.draw_commitment <> '' AND NEW.draw_commitment IS NOT OLD.draw_commitment BEGIN SELECT RAISE(ABORT, 'draw_commitment is written once'); END;
