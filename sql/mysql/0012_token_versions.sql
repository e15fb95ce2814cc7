-- The version of each user's admin tokens. An admin token carries the
-- version its user had when it was minted (its "ver" claim, none for 0);
-- "api token revoke --user N" and POST /api/v1/admin/users/{id}/revoke-tokens
-- raise it, and every instance refuses the user's admin tokens below it
-- from the next request on. A user without a row is at version 0. Kept
-- here rather than in Redis: a revocation must survive the loss of Redis's
-- state. Rows are for any user id, the operator's (below 1,000,000) too.
CREATE TABLE token_versions (
  user_id    BIGINT      NOT NULL,
  version    BIGINT      NOT NULL,
  revoked_at DATETIME(3) NOT NULL,
  PRIMARY KEY (user_id),
  CONSTRAINT chk_token_versions_version CHECK (version > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
