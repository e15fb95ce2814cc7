-- Order counters: how many of a voucher's orders are in each state (and,
-- cancelled, for which reason) and what they amount to, kept by every
-- transaction that writes an order or moves one (package order, counts.go),
-- so that the console's figures and the sweeper's state counts read a few
-- rows per voucher instead of counting its orders. A voucher's count in one
-- state is spread over slots (the writer adds in slot 0, a buyer's payment
-- or cancellation in another), so that payments at once do not queue on one
-- row; the count is the sum of its slots, and one slot alone may be
-- negative. cancel_reason is '' where the order's is NULL.
CREATE TABLE IF NOT EXISTS order_counts (
  voucher_id    BIGINT      NOT NULL,
  status        VARCHAR(32) NOT NULL,
  cancel_reason VARCHAR(32) NOT NULL DEFAULT '',
  slot          SMALLINT    NOT NULL,
  n             BIGINT      NOT NULL,
  amount        BIGINT      NOT NULL,
  PRIMARY KEY (voucher_id, status, cancel_reason, slot)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- The orders written so far, counted once (it reads the whole table: run
-- the upgrade between sales). The table and the count may be run again
-- after a failure part way (a migration is not atomic on MySQL).
DELETE FROM order_counts;
INSERT INTO order_counts (voucher_id, status, cancel_reason, slot, n, amount)
  SELECT voucher_id, status, COALESCE(cancel_reason, ''), 0, COUNT(*), COALESCE(SUM(amount), 0)
  FROM orders GROUP BY voucher_id, status, COALESCE(cancel_reason, '');

-- Purchases per second over the last seconds: the voucher's newest orders
-- by the time they were accepted, read from the index alone. It serves the
-- foreign key on voucher_id too, in place of the index on voucher_id alone.
ALTER TABLE orders ADD KEY idx_orders_voucher_accepted (voucher_id, accepted_at);
ALTER TABLE orders DROP INDEX idx_orders_voucher;
