-- The same as sql/mysql/0013_draw_entries_place.sql, in SQLite's dialect:
-- a draw's entries read a page at a time in the draw's order.
CREATE UNIQUE INDEX uniq_draw_entries_place ON draw_entries (voucher_id, place);
