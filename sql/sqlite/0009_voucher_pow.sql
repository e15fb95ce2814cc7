-- The same as sql/mysql/0009_voucher_pow.sql, in SQLite's dialect.
ALTER TABLE vouchers ADD COLUMN pow_bits INTEGER NOT NULL DEFAULT 0 CHECK (pow_bits BETWEEN 0 AND 24);
