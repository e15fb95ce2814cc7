-- A draw's commitment, once set, is never changed, by the service or by
-- anyone with the database's service account: the write is refused. A
-- migration of its own, after the columns (0014): on a server with the
-- binary log on, an account without SUPER creates a trigger only with
-- log_bin_trust_function_creators on (docs/operating.md, Real servers);
-- refused, this migration alone is tried again at the next start.
CREATE TRIGGER trg_vouchers_draw_commitment_once BEFORE UPDATE ON vouchers FOR EACH ROW IF OLD.draw_commitment <> '' AND NEW.draw_commitment <> OLD.draw_commitment THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'draw_commitment is written once'; END IF;
