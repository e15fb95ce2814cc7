-- A fair opening: a voucher with fair_window_ms > 0 takes entries into a
-- draw from its creation until begin_at + fair_window_ms; at the close the
-- entries are bought in an order fixed by draw_secret (HMAC-SHA256 of each
-- user id), a secret chosen at creation whose SHA-256 is published before
-- the close and which is itself published once the draw is done
-- (draw_done_at). draw_entries keeps every entry, its place in that order
-- and whether it won, so that anyone can check the draw.
ALTER TABLE vouchers
  ADD COLUMN fair_window_ms BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN draw_secret VARCHAR(64) NOT NULL DEFAULT '',
  ADD COLUMN draw_done_at DATETIME(3) NULL,
  ADD CONSTRAINT chk_vouchers_fair_window CHECK (fair_window_ms >= 0);

CREATE TABLE draw_entries (
  voucher_id BIGINT NOT NULL,
  user_id BIGINT NOT NULL,
  ticket_id BIGINT NOT NULL,
  place INT NOT NULL,
  won TINYINT(1) NOT NULL,
  PRIMARY KEY (voucher_id, user_id),
  CONSTRAINT fk_draw_entries_voucher FOREIGN KEY (voucher_id) REFERENCES vouchers (id)
);
