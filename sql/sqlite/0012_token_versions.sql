-- The same table as sql/mysql/0012_token_versions.sql, in SQLite's
-- dialect: each user's admin token version, raised by a revocation.
CREATE TABLE token_versions (
  user_id    INTEGER  NOT NULL PRIMARY KEY,
  version    INTEGER  NOT NULL CHECK (version > 0),
  revoked_at DATETIME NOT NULL
);
