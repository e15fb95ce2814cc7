-- The same schema as sql/mysql/0001_init.sql, in SQLite's dialect, for the
-- embedded mode.
CREATE TABLE vouchers (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  title       TEXT     NOT NULL,
  face_value  INTEGER  NOT NULL CHECK (face_value >= 0),
  total_stock INTEGER  NOT NULL,
  stock       INTEGER  NOT NULL CHECK (stock >= 0),
  begin_at    DATETIME NOT NULL,
  end_at      DATETIME NOT NULL,
  created_at  DATETIME NOT NULL,
  updated_at  DATETIME NOT NULL,
  CHECK (stock <= total_stock),
  CHECK (begin_at < end_at)
);
CREATE INDEX idx_vouchers_end_at ON vouchers (end_at);

CREATE TABLE orders (
  id          INTEGER  NOT NULL PRIMARY KEY,
  user_id     INTEGER  NOT NULL,
  voucher_id  INTEGER  NOT NULL REFERENCES vouchers (id),
  accepted_at DATETIME NOT NULL,
  created_at  DATETIME NOT NULL
);
CREATE UNIQUE INDEX uniq_orders_user_voucher ON orders (user_id, voucher_id);
CREATE INDEX idx_orders_voucher ON orders (voucher_id);

CREATE TABLE dead_letters (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  stream      TEXT     NOT NULL,
  message_id  TEXT     NOT NULL,
  order_id    INTEGER  NULL,
  user_id     INTEGER  NULL,
  voucher_id  INTEGER  NULL,
  reason      TEXT     NOT NULL,
  payload     TEXT     NOT NULL,
  created_at  DATETIME NOT NULL
);
CREATE UNIQUE INDEX uniq_dead_letters_order ON dead_letters (order_id);
CREATE UNIQUE INDEX uniq_dead_letters_message ON dead_letters (stream, message_id);
