-- The same as sql/mysql/0008_voucher_draw.sql, in SQLite's dialect.
ALTER TABLE vouchers ADD COLUMN fair_window_ms INTEGER NOT NULL DEFAULT 0 CHECK (fair_window_ms >= 0);
ALTER TABLE vouchers ADD COLUMN draw_secret TEXT NOT NULL DEFAULT '';
ALTER TABLE vouchers ADD COLUMN draw_done_at DATETIME NULL;

CREATE TABLE draw_entries (
  voucher_id INTEGER NOT NULL REFERENCES vouchers (id),
  user_id INTEGER NOT NULL,
  ticket_id INTEGER NOT NULL,
  place INTEGER NOT NULL,
  won INTEGER NOT NULL,
  PRIMARY KEY (voucher_id, user_id)
);
