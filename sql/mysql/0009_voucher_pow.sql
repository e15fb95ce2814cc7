-- Proof of work for a fair opening (optional per voucher): entering the
-- draw of a voucher with pow_bits k takes a nonce whose SHA-256, with the
-- voucher's challenge and the buyer, starts with k zero bits (package
-- draw). 0 (the default): no proof of work.
ALTER TABLE vouchers
  ADD COLUMN pow_bits INT NOT NULL DEFAULT 0,
  ADD CONSTRAINT chk_vouchers_pow_bits CHECK (pow_bits BETWEEN 0 AND 24);
