-- A draw nobody can bias. Until now a fair voucher's secret was made at
-- creation and kept in draw_secret, readable in any dump taken before the
-- close, and its commitment was recomputed from whatever secret the row
-- held. From this version:
--   draw_commitment  the SHA-256 of the secret, stored once at creation and
--                    published from then on; the trigger of 0015 refuses any
--                    write that changes it once set
--   draw_salt        what the secret is derived from with a key the
--                    database never holds (the instances', package draw):
--                    the database alone cannot tell the secret
--   draw_secret      empty until the draw is done, then the secret, revealed
--                    (a voucher made before this version keeps its secret
--                    there from the start, and its commitment empty)
--   draw_digest      the SHA-256 of the closed entry list, published at the
--                    close: the ranks are HMACs of it and each buyer, so no
--                    one can know a rank before the entries close
--   draw_pow_nonce   a random value the proof of work hashes, published when
--                    entries open (begin_at): no proof can be made earlier
ALTER TABLE vouchers
  ADD COLUMN draw_commitment VARCHAR(64) NOT NULL DEFAULT '',
  ADD COLUMN draw_salt VARCHAR(64) NOT NULL DEFAULT '',
  ADD COLUMN draw_digest VARCHAR(64) NOT NULL DEFAULT '',
  ADD COLUMN draw_pow_nonce VARCHAR(64) NOT NULL DEFAULT '';
