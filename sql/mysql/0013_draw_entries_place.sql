-- A draw's published entries are read a page at a time in the draw's
-- order (GET /api/v1/vouchers/{id}/draw/entries?after=PLACE&limit=N):
-- WHERE voucher_id = ? AND place > ? ORDER BY place LIMIT ?, a range of
-- this key, never a sort of the voucher's entries. A buyer's own entry is
-- read by the primary key (voucher_id, user_id). Unique: a place in a
-- draw's order is one entry's, so a page's cursor (the last place read)
-- skips none and repeats none. It reads the table once: run the upgrade
-- between sales.
ALTER TABLE draw_entries ADD UNIQUE KEY uniq_draw_entries_place (voucher_id, place);
