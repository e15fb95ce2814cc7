-- A paid order carries a voucher code: 10 characters from an alphabet
-- without look-alikes, drawn at random when the order becomes paid (paid
-- by its buyer, or written paid when there was nothing to pay). It is what
-- the buyer shows and the shop's cashier types to redeem the voucher. The
-- unique key makes a code name one order across every voucher, so a code
-- alone finds its order; NULL (unpaid, and orders paid before this
-- migration) repeats freely.
ALTER TABLE orders
  ADD COLUMN code VARCHAR(10) NULL,
  ADD UNIQUE KEY uniq_orders_code (code);
