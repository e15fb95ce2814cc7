-- After the grab: a voucher has a price to pay; an order waits for payment
-- within a window, then is paid and used, or cancelled (by its buyer, or
-- expired unpaid), or refunded once paid. A cancelled or refunded order
-- gave its unit back: it is no longer live, and its buyer may buy again.
--
-- live is 1 while the order holds a unit (awaiting_payment, paid, used) and
-- NULL once it gave the unit back: the unique key on (user_id, voucher_id,
-- live) then allows one live order per buyer and voucher beside any number
-- of ended ones. total_stock = stock + live orders at all times.
ALTER TABLE vouchers
  ADD COLUMN price BIGINT NOT NULL DEFAULT 0,
  ADD CONSTRAINT chk_vouchers_price CHECK (price >= 0 AND price <= face_value);

-- Orders written before this migration were of vouchers with nothing to
-- pay: they are paid.
ALTER TABLE orders
  ADD COLUMN status        VARCHAR(20) NOT NULL DEFAULT 'paid',
  ADD COLUMN live          TINYINT     NULL DEFAULT 1,
  ADD COLUMN amount        BIGINT      NOT NULL DEFAULT 0,
  ADD COLUMN pay_deadline  DATETIME(3) NULL,
  ADD COLUMN paid_at       DATETIME(3) NULL,
  ADD COLUMN used_at       DATETIME(3) NULL,
  ADD COLUMN cancelled_at  DATETIME(3) NULL,
  ADD COLUMN cancel_reason VARCHAR(16) NULL,
  ADD COLUMN refunded_at   DATETIME(3) NULL,
  ADD COLUMN unit_back_at  DATETIME(3) NULL,
  ADD UNIQUE KEY uniq_orders_live_buyer (user_id, voucher_id, live),
  ADD KEY idx_orders_due (status, pay_deadline),
  ADD KEY idx_orders_unit_back (live, unit_back_at),
  ADD CONSTRAINT chk_orders_live CHECK (
    (status IN ('awaiting_payment', 'paid', 'used') AND live = 1) OR
    (status IN ('cancelled', 'refunded') AND live IS NULL)),
  ADD CONSTRAINT chk_orders_amount CHECK (amount >= 0);
ALTER TABLE orders DROP INDEX uniq_orders_user_voucher;
-- They were paid when written.
UPDATE orders SET paid_at = created_at WHERE status = 'paid' AND paid_at IS NULL;

-- A payment of an order, made through a provider (dev, webhook). reference
-- is the provider's name for it. A payment that succeeded after its order
-- was cancelled never revives the order: it needs a refund.
CREATE TABLE payments (
  id           BIGINT      NOT NULL AUTO_INCREMENT,
  order_id     BIGINT      NOT NULL,
  provider     VARCHAR(32) NOT NULL,
  reference    VARCHAR(64) NOT NULL,
  amount       BIGINT      NOT NULL,
  status       VARCHAR(16) NOT NULL,
  created_at   DATETIME(3) NOT NULL,
  updated_at   DATETIME(3) NOT NULL,
  succeeded_at DATETIME(3) NULL,
  refunded_at  DATETIME(3) NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uniq_payments_reference (provider, reference),
  KEY idx_payments_order (order_id),
  KEY idx_payments_status (status),
  CONSTRAINT chk_payments_status CHECK (status IN ('created', 'succeeded', 'needs_refund', 'refunded')),
  CONSTRAINT chk_payments_amount CHECK (amount >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Notifications a payment gateway sent, by its id: one delivered twice
-- (a retry, or a replay) is recognised and changes nothing.
CREATE TABLE payment_notifications (
  provider        VARCHAR(32) NOT NULL,
  notification_id VARCHAR(64) NOT NULL,
  reference       VARCHAR(64) NOT NULL,
  received_at     DATETIME(3) NOT NULL,
  PRIMARY KEY (provider, notification_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
