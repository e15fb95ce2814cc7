-- The same as sql/mysql/0010_order_counts.sql, in SQLite's dialect.
CREATE TABLE IF NOT EXISTS order_counts (
  voucher_id    INTEGER NOT NULL,
  status        TEXT    NOT NULL,
  cancel_reason TEXT    NOT NULL DEFAULT '',
  slot          INTEGER NOT NULL,
  n             INTEGER NOT NULL,
  amount        INTEGER NOT NULL,
  PRIMARY KEY (voucher_id, status, cancel_reason, slot)
);
DELETE FROM order_counts;
INSERT INTO order_counts (voucher_id, status, cancel_reason, slot, n, amount)
  SELECT voucher_id, status, COALESCE(cancel_reason, ''), 0, COUNT(*), COALESCE(SUM(amount), 0)
  FROM orders GROUP BY voucher_id, status, COALESCE(cancel_reason, '');
CREATE INDEX idx_orders_voucher_accepted ON orders (voucher_id, accepted_at);
DROP INDEX idx_orders_voucher;
