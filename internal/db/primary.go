package db

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
)

// Primary connects to the database server that takes writes, among the
// hosts of a DSN (user:pass@tcp(db1:3306,db2:3306)/seckill: the first
// that answers and takes writes), and lets go of every connection it made
// once that server may no longer be the primary (Recycle).
//
// A failover moves the primary: behind a proxy or a DNS name the same
// address reaches another server, and with several hosts another host
// takes writes. Connections to a server that was killed fail and are
// dropped by the pool; connections to one that lives on read-only (a
// switchover, a DNS name moved while the old primary still runs) would go
// on failing every write. Each connection remembers the generation it was
// made in: Recycle starts a new one, and the pool then closes the older
// connections instead of using them again. A write refused for
// read-only-ness recycles by itself; the database watcher recycles when it
// finds the pool reaching a server that does not take writes.
//
// A new connection is kept only when its server takes writes (read_only
// off and, on Galera, the node ready), so a pool never fills with
// connections to a replica, even through an address still pointing at it.
//
// Primary also gates the order writer across a failover: each new
// connection names the server it reached, and one that reaches another
// server than the last one verified makes Verified false until the
// database watcher has checked the new server (that it lost nothing the
// sale's Redis saw, or that what it lost is written back) and calls
// Verify.
type Primary struct {
	hosts []driver.Connector
	addrs []string
	gen   atomic.Uint64
	// reached is the server the last new connection reached (hostname:port
	// server_id); verified the last one Verify was called for.
	mu       sync.Mutex
	reached  string
	verified string
}

// newPrimary returns a Primary for cfg, one host per comma-separated
// address of cfg.Addr.
func newPrimary(cfg *mysql.Config) (*Primary, error) {
	p := &Primary{}
	for _, addr := range strings.Split(cfg.Addr, ",") {
		addr = strings.TrimSpace(addr)
		if addr == "" {
			return nil, errors.New("mysql dsn: an empty host in tcp(...)")
		}
		c := cfg.Clone()
		c.Addr = addr
		conn, err := mysql.NewConnector(c)
		if err != nil {
			return nil, fmt.Errorf("mysql dsn: %w", err)
		}
		p.hosts = append(p.hosts, conn)
		p.addrs = append(p.addrs, addr)
	}
	return p, nil
}

// Hosts lists the addresses the DSN names, in the order they are tried.
func (p *Primary) Hosts() []string { return p.addrs }

// Recycle makes every connection made so far be closed rather than
// reused, from the next time the pool hands it out or takes it back.
func (p *Primary) Recycle() { p.gen.Add(1) }

// Connect returns a connection to the first host that answers and takes
// writes.
func (p *Primary) Connect(ctx context.Context) (driver.Conn, error) {
	gen := p.gen.Load()
	var errs []error
	for i, host := range p.hosts {
		c, err := host.Connect(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.addrs[i], err))
			continue
		}
		server, err := takesWrites(ctx, c)
		if err != nil {
			_ = c.Close()
			errs = append(errs, fmt.Errorf("%s: %w", p.addrs[i], err))
			continue
		}
		p.mu.Lock()
		p.reached = server
		p.mu.Unlock()
		return &conn{inner: c, p: p, gen: gen}, nil
	}
	if len(errs) == 1 {
		return nil, errs[0]
	}
	return nil, fmt.Errorf("no database host takes writes: %w", errors.Join(errs...))
}

// Verified reports whether the server the pool last connected to is the
// one the database watcher last verified (Verify): false from the first
// connection to another server until the watcher has checked it.
func (p *Primary) Verified() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reached != "" && p.reached == p.verified
}

// Verify records that server (Server.Label of what Describe read) holds
// everything the sale's Redis saw it commit. It verifies the pool only if
// its last new connection reached that same server.
func (p *Primary) Verify(server string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.verified = server
}

// Driver is the MySQL driver.
func (p *Primary) Driver() driver.Driver { return p.hosts[0].Driver() }

// ErrNotPrimary means a server answered but does not take writes.
var ErrNotPrimary = errors.New("database server does not take writes")

// takesWrites asks a new connection's server whether it takes writes:
// read_only off (a replica is read-only, and MariaDB lets an account with
// the READ ONLY ADMIN privilege, root included, write on one anyway), and
// on Galera the node ready (a node cut off from the primary component
// refuses every query). It returns the server's label, as Server.Label
// spells it.
func takesWrites(ctx context.Context, c driver.Conn) (string, error) {
	q := c.(driver.QueryerContext)
	vars, err := pairs(ctx, q, "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('read_only', 'wsrep_on', 'hostname', 'port', 'server_id')")
	if err != nil {
		return "", err
	}
	if vars["read_only"] != "OFF" {
		return "", fmt.Errorf("%w: read_only is %s", ErrNotPrimary, vars["read_only"])
	}
	id, _ := strconv.ParseUint(vars["server_id"], 10, 32)
	server := Server{Name: vars["hostname"] + ":" + vars["port"], ID: uint32(id)}.Label()
	if vars["wsrep_on"] != "ON" {
		return server, nil
	}
	status, err := pairs(ctx, q, "SHOW GLOBAL STATUS LIKE 'wsrep_ready'")
	if err != nil {
		return "", err
	}
	if status["wsrep_ready"] != "ON" {
		return "", fmt.Errorf("%w: galera node not ready (wsrep_ready %s)", ErrNotPrimary, status["wsrep_ready"])
	}
	return server, nil
}

// pairs runs a SHOW ... VARIABLES or STATUS on c and returns its rows,
// name to value.
func pairs(ctx context.Context, q driver.QueryerContext, query string) (map[string]string, error) {
	rows, err := q.QueryContext(ctx, query, nil)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	dest := make([]driver.Value, len(rows.Columns()))
	for {
		err := rows.Next(dest)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out[text(dest[0])] = text(dest[1])
	}
}

// text is a driver value as text.
func text(v driver.Value) string {
	switch v := v.(type) {
	case []byte:
		return string(v)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// isReadOnlyRefusal reports a write refused because the server is
// read-only: 1290 (--read-only), 1792 (a read-only transaction), 1836
// (read-only mode); or a Galera node that left the primary component
// (1047).
func isReadOnlyRefusal(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1290, 1792, 1836, 1047:
		return true
	}
	return false
}

// conn is a MySQL connection of a Primary, with the generation it was
// made in. It passes every call on to the driver's connection, which
// implements each interface below.
type conn struct {
	inner driver.Conn
	p     *Primary
	gen   uint64
}

func (c *conn) stale() bool { return c.gen != c.p.gen.Load() }

// seen recycles the Primary's connections when err says the server no
// longer takes writes.
func (c *conn) seen(err error) error {
	if err != nil && isReadOnlyRefusal(err) {
		c.p.Recycle()
	}
	return err
}

func (c *conn) Prepare(query string) (driver.Stmt, error) { return c.inner.Prepare(query) }
func (c *conn) Close() error                              { return c.inner.Close() }
func (c *conn) Begin() (driver.Tx, error)                 { return c.BeginTx(context.Background(), driver.TxOptions{}) }

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.inner.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, c.seen(err)
	}
	return &txn{inner: tx, c: c}, nil
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	s, err := c.inner.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	return s, c.seen(err)
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.inner.(driver.ExecerContext).ExecContext(ctx, query, args)
	return r, c.seen(err)
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.inner.(driver.QueryerContext).QueryContext(ctx, query, args)
	return r, c.seen(err)
}

func (c *conn) Ping(ctx context.Context) error { return c.inner.(driver.Pinger).Ping(ctx) }

// ResetSession refuses (driver.ErrBadConn: the pool closes it) a
// connection made before the last Recycle.
func (c *conn) ResetSession(ctx context.Context) error {
	if c.stale() {
		return driver.ErrBadConn
	}
	return c.inner.(driver.SessionResetter).ResetSession(ctx)
}

// IsValid is false for a connection made before the last Recycle: the
// pool closes it rather than keep it.
func (c *conn) IsValid() bool { return !c.stale() && c.inner.(driver.Validator).IsValid() }

func (c *conn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.inner.(driver.NamedValueChecker).CheckNamedValue(nv)
}

// txn is a transaction of a conn: a commit refused for read-only-ness
// recycles too.
type txn struct {
	inner driver.Tx
	c     *conn
}

func (t *txn) Commit() error   { return t.c.seen(t.inner.Commit()) }
func (t *txn) Rollback() error { return t.inner.Rollback() }
