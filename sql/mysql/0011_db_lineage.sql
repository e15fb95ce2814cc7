-- The database's lineage: a token made when the database is created, and
-- made anew by whoever restores it from a dump (the restore recipe in
-- docs/operating.md runs the UPDATE). A replica promoted after a failover
-- holds the same token as the primary it copied; a restored database holds
-- another. The sale's Redis records the token beside what it saw the
-- database commit, so a database that lacks commits Redis saw is told apart:
-- the same lineage lost them in a failover (and the service writes them
-- again from Redis), another lineage was restored on purpose (and Redis is
-- rebuilt from it instead).
CREATE TABLE IF NOT EXISTS db_lineage (
  id    TINYINT     NOT NULL,
  token VARCHAR(64) NOT NULL,
  since DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  CONSTRAINT chk_db_lineage_one_row CHECK (id = 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

INSERT INTO db_lineage (id, token, since)
  SELECT 1, REPLACE(UUID(), '-', ''), UTC_TIMESTAMP(3) FROM DUAL
  WHERE NOT EXISTS (SELECT 1 FROM db_lineage);
