-- A voucher's stock can be split over buckets, each a Redis hash on its own
-- shard (so on its own master of a cluster): a hot sale then runs on every
-- master instead of one. 1 is one bucket, the layout of vouchers before
-- this migration. The count is fixed at creation: a buyer's bucket is a
-- hash of the user id over it, and one order per buyer holds because a
-- buyer only ever buys in that bucket.
ALTER TABLE vouchers
  ADD COLUMN buckets SMALLINT NOT NULL DEFAULT 1,
  ADD CONSTRAINT chk_vouchers_buckets CHECK (buckets BETWEEN 1 AND 64);
