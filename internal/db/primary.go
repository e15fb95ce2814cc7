package db

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
)

// Primary connects to the database server that takes writes, among the
// hosts of a DSN (user:pass@tcp(db1:3306,db2:3306)/seckill: the one that
// took writes last while it still does, else the first that answers and
// takes writes), and lets go of every connection it made once that server
// may no longer be the primary (Recycle).
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
	// last is the host that took writes last: tried first.
	last atomic.Int32
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

// seq is 0, 1, ..., n-1.
func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// Hosts lists the addresses the DSN names, in the order they are tried.
func (p *Primary) Hosts() []string { return p.addrs }

// Recycle makes every connection made so far be closed rather than
// reused, from the next time the pool hands it out or takes it back.
func (p *Primary) Recycle() { p.gen.Add(1) }

// Connect returns a connection to the host that took writes last, while
// it still does, else to the first host of the DSN's order that answers
// and takes writes: a failed-over primary restarted writable does not
// draw the pool back, and a dead first host costs no dial per connection.
func (p *Primary) Connect(ctx context.Context) (driver.Conn, error) {
	gen := p.gen.Load()
	var errs []error
	last := int(p.last.Load())
	order := append([]int{last}, slices.DeleteFunc(seq(len(p.hosts)), func(i int) bool { return i == last })...)
	for _, i := range order {
		c, err := p.hosts[i].Connect(ctx)
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
		p.last.Store(int32(i))
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

// takesWrites asks a new connection's server whether it takes writes, by
// Server.Primary's rule (MariaDB lets an account with the READ ONLY ADMIN
// privilege, root included, write on a read-only replica anyway: the
// service does not), and returns the server's Identity.
func takesWrites(ctx context.Context, c driver.Conn) (string, error) {
	q := c.(driver.QueryerContext)
	s, err := serverOf(ctx, func(ctx context.Context, query string) (map[string]string, error) { return pairs(ctx, q, query) })
	if err != nil {
		return "", err
	}
	switch {
	case s.ReadOnly:
		return "", fmt.Errorf("%w: read_only is on", ErrNotPrimary)
	case !s.Primary():
		return "", fmt.Errorf("%w: galera node not ready (%s)", ErrNotPrimary, s.GaleraState)
	}
	return s.Identity(), nil
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
		// Once per generation: the refusals of connections already made
		// stale do not drop the new ones as well.
		c.p.gen.CompareAndSwap(c.gen, c.gen+1)
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
