-- The same as sql/mysql/0011_db_lineage.sql, in SQLite's dialect.
CREATE TABLE IF NOT EXISTS db_lineage (
  id    INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
  token TEXT    NOT NULL,
  since DATETIME NOT NULL
);
INSERT INTO db_lineage (id, token, since)
  SELECT 1, lower(hex(randomblob(16))), strftime('%Y-%m-%d %H:%M:%f', 'now')
  WHERE NOT EXISTS (SELECT 1 FROM db_lineage);
