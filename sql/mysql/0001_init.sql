-- Vouchers on sale. stock is what MySQL still has to sell; total_stock is what
-- the sale started with, so total_stock = stock + orders at all times.
CREATE TABLE vouchers (
  id          BIGINT       NOT NULL AUTO_INCREMENT,
  title       VARCHAR(200) NOT NULL,
  face_value  BIGINT       NOT NULL,
  total_stock INT          NOT NULL,
  stock       INT          NOT NULL,
  begin_at    DATETIME(3)  NOT NULL,
  end_at      DATETIME(3)  NOT NULL,
  created_at  DATETIME(3)  NOT NULL,
  updated_at  DATETIME(3)  NOT NULL,
  PRIMARY KEY (id),
  KEY idx_vouchers_end_at (end_at),
  CONSTRAINT chk_vouchers_stock_nonneg CHECK (stock >= 0),
  CONSTRAINT chk_vouchers_stock_le_total CHECK (stock <= total_stock),
  CONSTRAINT chk_vouchers_face_value CHECK (face_value >= 0),
  CONSTRAINT chk_vouchers_window CHECK (begin_at < end_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Orders written by the worker. The id is the one the API returned; the
-- unique (user_id, voucher_id) key is the last guard against a second order.
CREATE TABLE orders (
  id          BIGINT      NOT NULL,
  user_id     BIGINT      NOT NULL,
  voucher_id  BIGINT      NOT NULL,
  accepted_at DATETIME(3) NOT NULL,
  created_at  DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uniq_orders_user_voucher (user_id, voucher_id),
  KEY idx_orders_voucher (voucher_id),
  CONSTRAINT fk_orders_voucher FOREIGN KEY (voucher_id) REFERENCES vouchers (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Stream messages that could not become an order, with the reason. An order id
-- appears at most once here, and never both here and in orders.
CREATE TABLE dead_letters (
  id          BIGINT       NOT NULL AUTO_INCREMENT,
  stream      VARCHAR(200) NOT NULL,
  message_id  VARCHAR(64)  NOT NULL,
  order_id    BIGINT       NULL,
  user_id     BIGINT       NULL,
  voucher_id  BIGINT       NULL,
  reason      VARCHAR(64)  NOT NULL,
  payload     TEXT         NOT NULL,
  created_at  DATETIME(3)  NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uniq_dead_letters_order (order_id),
  UNIQUE KEY uniq_dead_letters_message (stream, message_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
