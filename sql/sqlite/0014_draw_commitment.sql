-- The same as sql/mysql/0014_draw_commitment.sql, in SQLite's dialect.
ALTER TABLE vouchers ADD COLUMN draw_commitment TEXT NOT NULL DEFAULT '';
ALTER TABLE vouchers ADD COLUMN draw_salt TEXT NOT NULL DEFAULT '';
ALTER TABLE vouchers ADD COLUMN draw_digest TEXT NOT NULL DEFAULT '';
ALTER TABLE vouchers ADD COLUMN draw_pow_nonce TEXT NOT NULL DEFAULT '';
