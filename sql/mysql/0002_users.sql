-- Shoppers who log in with a phone and a one-time code. The first login
-- creates the row. Ids start at 1,000,000: lower ones are left to tokens the
-- operator mints (api token --user N), so the two never name one person.
-- Admins are configured (SECKILL_ADMIN_PHONES), not stored.
CREATE TABLE users (
  id            BIGINT      NOT NULL AUTO_INCREMENT,
  phone         VARCHAR(16) NOT NULL,
  created_at    DATETIME(3) NOT NULL,
  last_login_at DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uniq_users_phone (phone)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 AUTO_INCREMENT=1000000;
