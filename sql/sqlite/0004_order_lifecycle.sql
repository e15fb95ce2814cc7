-- The same as sql/mysql/0004_order_lifecycle.sql, in SQLite's dialect.
ALTER TABLE vouchers ADD COLUMN price INTEGER NOT NULL DEFAULT 0 CHECK (price >= 0 AND price <= face_value);

ALTER TABLE orders ADD COLUMN status TEXT NOT NULL DEFAULT 'paid'
  CHECK (status IN ('awaiting_payment', 'paid', 'used', 'cancelled', 'refunded'));
ALTER TABLE orders ADD COLUMN live INTEGER NULL DEFAULT 1
  CHECK ((status IN ('awaiting_payment', 'paid', 'used') AND live = 1) OR
         (status IN ('cancelled', 'refunded') AND live IS NULL));
ALTER TABLE orders ADD COLUMN amount INTEGER NOT NULL DEFAULT 0 CHECK (amount >= 0);
ALTER TABLE orders ADD COLUMN pay_deadline DATETIME NULL;
ALTER TABLE orders ADD COLUMN paid_at DATETIME NULL;
ALTER TABLE orders ADD COLUMN used_at DATETIME NULL;
ALTER TABLE orders ADD COLUMN cancelled_at DATETIME NULL;
ALTER TABLE orders ADD COLUMN cancel_reason TEXT NULL;
ALTER TABLE orders ADD COLUMN refunded_at DATETIME NULL;
ALTER TABLE orders ADD COLUMN unit_back_at DATETIME NULL;
DROP INDEX uniq_orders_user_voucher;
CREATE UNIQUE INDEX uniq_orders_live_buyer ON orders (user_id, voucher_id, live);
CREATE INDEX idx_orders_due ON orders (status, pay_deadline);
CREATE INDEX idx_orders_unit_back ON orders (live, unit_back_at);
-- They were paid when written.
UPDATE orders SET paid_at = created_at WHERE status = 'paid' AND paid_at IS NULL;

CREATE TABLE payments (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  order_id     INTEGER  NOT NULL,
  provider     TEXT     NOT NULL,
  reference    TEXT     NOT NULL,
  amount       INTEGER  NOT NULL CHECK (amount >= 0),
  status       TEXT     NOT NULL CHECK (status IN ('created', 'succeeded', 'needs_refund', 'refunded')),
  created_at   DATETIME NOT NULL,
  updated_at   DATETIME NOT NULL,
  succeeded_at DATETIME NULL,
  refunded_at  DATETIME NULL
);
CREATE UNIQUE INDEX uniq_payments_reference ON payments (provider, reference);
CREATE INDEX idx_payments_order ON payments (order_id);
CREATE INDEX idx_payments_status ON payments (status);

CREATE TABLE payment_notifications (
  provider        TEXT     NOT NULL,
  notification_id TEXT     NOT NULL,
  reference       TEXT     NOT NULL,
  received_at     DATETIME NOT NULL,
  PRIMARY KEY (provider, notification_id)
);
