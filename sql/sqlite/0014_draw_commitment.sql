-- The same as sql/mysql/0014_draw_commitment.sql, in SQLite's dialect.
ALTER TABLE vouchers ADD COLUMN draw_commitment TEXT NOT NULL DEFAULT '';
ALTER TABLE vouchers ADD COLUMN draw_salt TEXT NOT NULL DEFAULT '';
ALTER TABLE vouchers ADD COLUMN draw_digest TEXT NOT NULL DEFAULT '';
ALTER TABLE vouchers ADD COLUMN draw_pow_nonce TEXT NOT NULL DEFAULT '';
CREATE TRIGGER trg_vouchers_draw_commitment_once BEFORE UPDATE OF draw_commitment ON vouchers WHEN OLD.draw_commitment <> '' AND NEW.draw_commitment IS NOT OLD.draw_commitment BEGIN SELECT RAISE(ABORT, 'draw_commitment is written once'); END;
