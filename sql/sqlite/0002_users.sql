-- The same table as sql/mysql/0002_users.sql, in SQLite's dialect. The
-- sqlite_sequence row makes AUTOINCREMENT start at 1,000,000.
CREATE TABLE users (
  id            INTEGER PRIMARY KEY AUTOINCREMENT,
  phone         TEXT     NOT NULL,
  created_at    DATETIME NOT NULL,
  last_login_at DATETIME NOT NULL
);
CREATE UNIQUE INDEX uniq_users_phone ON users (phone);
INSERT INTO sqlite_sequence (name, seq) VALUES ('users', 999999);
