package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"
)

// Server is what the database server a pool reaches says of itself: which
// server it is, whether it takes writes, and how far its history reaches.
// An address that moves (a proxy, DNS, a DSN of several hosts) reaches
// another server after a failover; Server tells which.
type Server struct {
	// Name is the server as it names itself: @@hostname:@@port, and
	// "sqlite" for the embedded mode's file.
	Name string
	// ID is @@server_id: every server of a replicated set has its own.
	ID uint32
	// ReadOnly is @@read_only: a replica, or a primary being demoted.
	ReadOnly bool
	// History is how far the server's history reaches (MariaDB's
	// @@gtid_binlog_state and @@gtid_slave_pos together); empty without a
	// binary log, on MySQL and on SQLite, where no failover is told from
	// the history.
	History History
	// Galera is true on a Galera node; GaleraState is its
	// wsrep_local_state_comment (Synced, Donor/Desynced, ...) and
	// GaleraSize the nodes of its primary component.
	Galera      bool
	GaleraState string
	GaleraSize  int
}

// Label names the server in logs and metrics: its name and server id.
func (s Server) Label() string {
	if s.ID == 0 {
		return s.Name
	}
	return s.Name + " (server_id " + strconv.FormatUint(uint64(s.ID), 10) + ")"
}

// Primary reports whether the server takes the service's writes.
func (s Server) Primary() bool {
	return !s.ReadOnly && (!s.Galera || s.GaleraState == "Synced")
}

// Describe asks the server g reaches who it is. Each query runs on
// whatever connection the pool hands out; on a pool that reaches one
// server at a time (OpenPrimary) they agree.
func Describe(ctx context.Context, g *gorm.DB) (Server, error) {
	if g.Dialector.Name() != "mysql" {
		return Server{Name: "sqlite"}, nil
	}
	sqlDB, err := g.DB()
	if err != nil {
		return Server{}, err
	}
	// One connection for every query, so they describe one server.
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return Server{}, fmt.Errorf("describe database server: %w", err)
	}
	defer conn.Close()
	var (
		s        Server
		host     string
		port     int
		readOnly int
	)
	if err := conn.QueryRowContext(ctx, "SELECT @@hostname, @@port, @@server_id, @@global.read_only").Scan(&host, &port, &s.ID, &readOnly); err != nil {
		return Server{}, fmt.Errorf("describe database server: %w", err)
	}
	s.Name, s.ReadOnly = host+":"+strconv.Itoa(port), readOnly != 0
	if s.History, err = history(ctx, conn); err != nil {
		return Server{}, err
	}
	status, err := wsrepStatus(ctx, conn)
	if err != nil {
		return Server{}, err
	}
	if status["wsrep_on"] == "ON" {
		ready := status["wsrep_ready"]
		s.Galera = true
		s.GaleraState = status["wsrep_local_state_comment"]
		s.GaleraSize, _ = strconv.Atoi(status["wsrep_cluster_size"])
		if ready != "ON" {
			s.GaleraState = "not ready: " + s.GaleraState
		}
	}
	return s, nil
}

// history reads MariaDB's GTID state: the last transaction of each origin
// in the binary log, and the last one applied by replication (a replica
// without log_slave_updates keeps those only there). MySQL has neither
// variable (error 1193): no history.
func history(ctx context.Context, conn *sql.Conn) (History, error) {
	var binlog, slave string
	err := conn.QueryRowContext(ctx, "SELECT @@global.gtid_binlog_state, @@global.gtid_slave_pos").Scan(&binlog, &slave)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1193 {
		return History{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the database's gtid state: %w", err)
	}
	h, err := ParseGTIDs(binlog)
	if err != nil {
		return nil, err
	}
	applied, err := ParseGTIDs(slave)
	if err != nil {
		return nil, err
	}
	h.Merge(applied)
	return h, nil
}

// wsrepStatus reads whether Galera is on (wsrep_on) and, when it is, its
// status: wsrep_ready, wsrep_cluster_size, wsrep_local_state_comment.
// MySQL has none of them: an empty map.
func wsrepStatus(ctx context.Context, conn *sql.Conn) (map[string]string, error) {
	out := map[string]string{}
	for _, q := range []string{
		"SHOW GLOBAL VARIABLES LIKE 'wsrep_on'",
		"SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_cluster_size', 'wsrep_local_state_comment')",
	} {
		rows, err := conn.QueryContext(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("read the database's galera status: %w", err)
		}
		for rows.Next() {
			var k, v string
			if err := rows.Scan(&k, &v); err != nil {
				rows.Close()
				return nil, err
			}
			out[k] = v
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if out["wsrep_on"] != "ON" {
			return map[string]string{}, nil
		}
	}
	return out, nil
}

// ErrNoGTIDs means the database gives its transactions no GTID this
// package reads: SQLite, or MySQL (whose GTIDs are another kind).
var ErrNoGTIDs = errors.New("the database tells no MariaDB gtid")

// LastGTID is the GTID of the last transaction committed on conn's
// session (MariaDB's @@last_gtid), "" when it has none (no binary log);
// ErrNoGTIDs on SQLite and MySQL.
func LastGTID(ctx context.Context, conn *gorm.DB) (string, error) {
	if conn.Dialector.Name() != "mysql" {
		return "", ErrNoGTIDs
	}
	var g sql.NullString
	err := conn.WithContext(ctx).Raw("SELECT @@last_gtid").Row().Scan(&g)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1193 {
		return "", ErrNoGTIDs
	}
	if err != nil {
		return "", fmt.Errorf("read the last gtid: %w", err)
	}
	return g.String, nil
}

// Lineage is the database's lineage token (the db_lineage table): the
// same on a replica promoted after a failover as on the primary it copied,
// another after a restore from a dump.
func Lineage(ctx context.Context, g *gorm.DB) (string, error) {
	var token string
	if err := g.WithContext(ctx).Raw("SELECT token FROM db_lineage WHERE id = 1").Row().Scan(&token); err != nil {
		return "", fmt.Errorf("read the database's lineage: %w", err)
	}
	return token, nil
}
