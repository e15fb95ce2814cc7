package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

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
	// binary log, on MySQL, on Galera (whose nodes' GTIDs need not agree)
	// and on SQLite, where no loss is told from the history.
	History History
	// Galera is true on a Galera node: GaleraCluster is its cluster's
	// state uuid (wsrep_cluster_state_uuid, the same on every node of one
	// cluster), GaleraReady whether it takes queries (wsrep_ready),
	// GaleraState its wsrep_local_state_comment (Synced, Donor/Desynced,
	// ...) and GaleraSize the nodes of its primary component.
	Galera        bool
	GaleraCluster string
	GaleraReady   bool
	GaleraState   string
	GaleraSize    int
}

// Label names the server in logs and metrics: its name and server id, and
// on Galera its node state.
func (s Server) Label() string {
	l := s.Name
	if s.ID != 0 {
		l += " (server_id " + strconv.FormatUint(uint64(s.ID), 10) + ")"
	}
	return l
}

// Identity names what holds the database's commits: the server (Label),
// or on Galera the cluster, whose every node holds every commit, so that a
// move from one node to another is not a change of primary.
func (s Server) Identity() string {
	if s.Galera {
		return "galera cluster " + s.GaleraCluster
	}
	return s.Label()
}

// Primary reports whether the server takes the service's writes: read_only
// off and, on Galera, the node ready. A new connection is kept by the same
// rule (Primary.Connect).
func (s Server) Primary() bool { return !s.ReadOnly && (!s.Galera || s.GaleraReady) }

// Describe asks the server g reaches who it is, on one connection, so that
// every answer is of one server.
func Describe(ctx context.Context, g *gorm.DB) (Server, error) {
	if g.Dialector.Name() != "mysql" {
		return Server{Name: "sqlite"}, nil
	}
	sqlDB, err := g.DB()
	if err != nil {
		return Server{}, err
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return Server{}, fmt.Errorf("describe database server: %w", err)
	}
	defer conn.Close()
	s, err := serverOf(ctx, func(ctx context.Context, query string) (map[string]string, error) {
		return sqlPairs(ctx, conn, query)
	})
	if err != nil {
		return Server{}, fmt.Errorf("describe database server: %w", err)
	}
	if s.Galera {
		s.History = History{}
		return s, nil
	}
	if s.History, err = history(ctx, conn); err != nil {
		return Server{}, err
	}
	return s, nil
}

// pairsFn runs a SHOW ... VARIABLES or STATUS and returns its rows, name
// to value.
type pairsFn func(ctx context.Context, query string) (map[string]string, error)

// serverOf reads a server's identity and whether it takes writes: its
// variables, and on Galera its status. MySQL has no wsrep_on (no Galera).
func serverOf(ctx context.Context, pairs pairsFn) (Server, error) {
	vars, err := pairs(ctx, "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('read_only', 'wsrep_on', 'hostname', 'port', 'server_id')")
	if err != nil {
		return Server{}, err
	}
	id, _ := strconv.ParseUint(vars["server_id"], 10, 32)
	s := Server{Name: vars["hostname"] + ":" + vars["port"], ID: uint32(id), ReadOnly: vars["read_only"] != "OFF"}
	if vars["wsrep_on"] != "ON" {
		return s, nil
	}
	status, err := pairs(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_cluster_size', 'wsrep_local_state_comment', 'wsrep_cluster_state_uuid')")
	if err != nil {
		return Server{}, err
	}
	s.Galera, s.GaleraReady = true, status["wsrep_ready"] == "ON"
	s.GaleraCluster, s.GaleraState = status["wsrep_cluster_state_uuid"], status["wsrep_local_state_comment"]
	s.GaleraSize, _ = strconv.Atoi(status["wsrep_cluster_size"])
	return s, nil
}

// sqlPairs runs a SHOW on conn, name to value.
func sqlPairs(ctx context.Context, conn *sql.Conn, query string) (map[string]string, error) {
	rows, err := conn.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, rows.Err()
}

// history reads MariaDB's GTID state: the last transaction of each origin
// in the binary log, and the last one applied by replication (a replica
// without log_slave_updates keeps those only there). MySQL has neither
// variable (error 1193): no history.
func history(ctx context.Context, conn *sql.Conn) (History, error) {
	var binlog, slave string
	err := conn.QueryRowContext(ctx, "SELECT @@global.gtid_binlog_state, @@global.gtid_slave_pos").Scan(&binlog, &slave)
	if IsUnknownVariable(err) {
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
	if IsUnknownVariable(err) {
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
