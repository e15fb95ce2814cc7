-- The same as sql/mysql/0007_voucher_buckets.sql, in SQLite's dialect
-- (SQLite adds a column's CHECK with the column).
ALTER TABLE vouchers ADD COLUMN buckets INTEGER NOT NULL DEFAULT 1 CHECK (buckets BETWEEN 1 AND 64);
