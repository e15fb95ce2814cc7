-- Every payment whose money must go back to its buyer is needs_refund, and
-- says why (refund_reason) and since when (refund_requested_at):
--
--   late            the money came after its order was cancelled
--   duplicate       the money came for an order another payment paid
--   order_refunded  an admin refunded the order this payment paid
--
-- An admin refund moves the order to refunded and its succeeded payment to
-- needs_refund in one transaction; the payment is refunded (refunded_at)
-- when an admin marks the money returned.
ALTER TABLE payments
  ADD COLUMN refund_requested_at DATETIME(3) NULL,
  ADD COLUMN refund_reason       VARCHAR(16) NULL,
  ADD CONSTRAINT chk_payments_refund_reason CHECK (
    refund_reason IS NULL OR refund_reason IN ('late', 'duplicate', 'order_refunded')),
  ADD KEY idx_payments_owed (status, refund_requested_at);

-- Payments owed (or returned) before this migration came late or twice.
UPDATE payments p JOIN orders o ON o.id = p.order_id
  SET p.refund_requested_at = p.succeeded_at,
      p.refund_reason = CASE WHEN o.status = 'cancelled' THEN 'late' ELSE 'duplicate' END
  WHERE p.status IN ('needs_refund', 'refunded');

-- Orders refunded before this migration left their payment succeeded: the
-- money is owed since the refund.
UPDATE payments p JOIN orders o ON o.id = p.order_id
  SET p.status = 'needs_refund',
      p.refund_requested_at = COALESCE(o.refunded_at, p.updated_at),
      p.refund_reason = 'order_refunded'
  WHERE p.status = 'succeeded' AND o.status = 'refunded';
