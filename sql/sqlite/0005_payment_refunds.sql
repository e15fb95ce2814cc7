-- The same as sql/mysql/0005_payment_refunds.sql, in SQLite's dialect.
ALTER TABLE payments ADD COLUMN refund_requested_at DATETIME NULL;
ALTER TABLE payments ADD COLUMN refund_reason TEXT NULL
  CHECK (refund_reason IS NULL OR refund_reason IN ('late', 'duplicate', 'order_refunded'));
CREATE INDEX idx_payments_owed ON payments (status, refund_requested_at);

UPDATE payments
  SET refund_requested_at = succeeded_at,
      refund_reason = CASE WHEN (SELECT status FROM orders WHERE orders.id = payments.order_id) = 'cancelled'
                           THEN 'late' ELSE 'duplicate' END
  WHERE status IN ('needs_refund', 'refunded');

UPDATE payments
  SET status = 'needs_refund',
      refund_requested_at = COALESCE((SELECT refunded_at FROM orders WHERE orders.id = payments.order_id), updated_at),
      refund_reason = 'order_refunded'
  WHERE status = 'succeeded'
    AND (SELECT status FROM orders WHERE orders.id = payments.order_id) = 'refunded';
