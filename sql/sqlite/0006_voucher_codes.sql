-- The same as sql/mysql/0006_voucher_codes.sql, in SQLite's dialect.
ALTER TABLE orders ADD COLUMN code TEXT NULL;
CREATE UNIQUE INDEX uniq_orders_code ON orders (code);
