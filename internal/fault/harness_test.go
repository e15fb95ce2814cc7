package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/db"
	"seckill/internal/testenv"
	"seckill/internal/verify"
	"seckill/internal/voucher"
)

const (
	secret = "fault-secret-fault-secret-fault-secret"
	group  = "order-writers" // the service's consumer group
)

func TestMain(m *testing.M) { testenv.Main(m) }

// cluster is one scenario's world: its own Redis and MariaDB, the
// instances it started, and the sale it ran.
type cluster struct {
	t      *testing.T
	redis  *testenv.RedisServer
	maria  *testenv.MariaDB
	dsn    string
	prefix string
	rdb    *redis.Client
	db     *gorm.DB
	keys   voucher.Keys
	env    map[string]string // settings every instance gets
	http   *http.Client
}

func newCluster(t *testing.T, aof bool) *cluster {
	t.Helper()
	c := &cluster{t: t, prefix: "seckill"}
	c.redis = testenv.StartRedis(t, testenv.RedisOptions{AppendOnly: aof})
	c.maria = testenv.StartMariaDB(t)
	c.dsn = c.maria.CreateDatabase(t)
	c.rdb = redis.NewClient(&redis.Options{Addr: c.redis.Addr, MaxRetries: 0, DialTimeout: time.Second})
	t.Cleanup(func() { c.rdb.Close() })
	c.keys = voucher.NewKeys(c.prefix, 1)
	c.env = settings(c.redis.URL(), c.dsn)
	c.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	return c
}

// settings are what every instance of a scenario gets: its Redis and
// database, quick worker and warmer rounds, logs at warn and above.
func settings(redisURL, dsn string) map[string]string {
	return map[string]string{
		"SECKILL_REDIS_URL": redisURL, "SECKILL_MYSQL_DSN": dsn, "SECKILL_TOKEN_SECRET": secret,
		"SECKILL_LOG_LEVEL": "warn", "SECKILL_WORKER_BLOCK": "100ms", "SECKILL_RECLAIM_IDLE": "1s",
		"SECKILL_WARM_INTERVAL": "300ms", "SECKILL_SHUTDOWN_TIMEOUT": "5s", "SECKILL_ADMIN_ADDR": "off",
		"SECKILL_RATE_LIMIT": "off",
	}
}

// openDB opens the scenario's database for checks, once it exists.
func (c *cluster) openDB() *gorm.DB {
	c.t.Helper()
	if c.db == nil {
		g, err := db.OpenMySQL(c.dsn, 4)
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(func() { db.Close(g) })
		c.db = g
	}
	return c.db
}

// instance is one service process.
type instance struct {
	name string
	base string
	cmd  *exec.Cmd
	done chan struct{}
	log  *testenv.Buffer // what it printed
}

// start runs the service binary with the cluster's settings and extra
// ones, and waits for it to answer (API instances) or to start its worker.
func (c *cluster) start(name string, extra map[string]string) *instance {
	c.t.Helper()
	addr := "127.0.0.1:" + testenv.FreePort(c.t)
	env := os.Environ()
	for k, v := range c.env {
		env = append(env, k+"="+v)
	}
	env = append(env, "SECKILL_ADDR="+addr)
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	out := &testenv.Buffer{}
	cmd := exec.Command(testenv.Binary(c.t, "seckill/cmd/api"))
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	in := &instance{name: name, base: "http://" + addr, cmd: cmd, done: make(chan struct{}), log: out}
	go func() { _ = cmd.Wait(); close(in.done) }()
	c.t.Cleanup(func() {
		if !in.exited() {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-in.done
		}
		if c.t.Failed() {
			c.t.Logf("log of %s:\n%s", name, tailLines(out.String(), 40))
		}
	})
	if extra["SECKILL_ROLE"] == "worker" {
		testenv.WaitFor(c.t, 20*time.Second, "worker "+name+" started", func() bool {
			return in.exited() || strings.Contains(out.String(), `"worker started"`) || c.workerStarted(name)
		})
	} else {
		testenv.WaitFor(c.t, 20*time.Second, "instance "+name+" healthy", func() bool {
			if in.exited() {
				c.t.Fatalf("instance %s exited at start", name)
			}
			resp, err := c.http.Get(in.base + "/healthz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
	}
	return in
}

// workerStarted reports a consumer of the group exists; the worker logs at
// info, below the scenarios' log level, so this is how to see it.
func (c *cluster) workerStarted(string) bool {
	cs, err := c.rdb.XInfoConsumers(context.Background(), c.keys.Stream(0), group).Result()
	return err == nil && len(cs) > 0
}

func (in *instance) exited() bool {
	select {
	case <-in.done:
		return true
	default:
		return false
	}
}

// pause stops the instance's process (SIGSTOP), as a paused machine
// would be: it holds its connections and answers nothing. resume undoes it.
func (in *instance) pause(t *testing.T) {
	t.Helper()
	if err := in.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

func (in *instance) resume(t *testing.T) {
	t.Helper()
	if err := in.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// stopped reports whether the process is stopped (state T in /proc), by
// a signal of the test's or by its own crash point.
func (in *instance) stopped() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", in.cmd.Process.Pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && strings.HasPrefix(rest, "T")
}

// signal sends sig to the instance and, for a stop, waits for its exit.
func (in *instance) signal(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	if err := in.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	return in.wait(t, sig)
}

// wait waits for the instance's exit after sig and returns its code.
func (in *instance) wait(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	select {
	case <-in.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit within 30s of %v", in.name, sig)
	}
	return in.cmd.ProcessState.ExitCode()
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func token(t *testing.T, user int64, role string) string {
	t.Helper()
	s, err := auth.NewSigner([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := s.Mint(auth.Identity{UserID: user, Role: role}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

type answer struct {
	status int
	code   string
	order  int64
	err    error
	// retryAfter is the answer's Retry-After header.
	retryAfter string
}

func (c *cluster) do(method, url, tok string, body any) answer {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := c.http.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	a := answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	a.code, _ = out["code"].(string)
	if s, ok := out["order_id"].(string); ok {
		a.order, _ = strconv.ParseInt(s, 10, 64)
	}
	if v, ok := out["voucher"].(map[string]any); ok {
		a.order = int64(v["id"].(float64)) // create: the voucher id
	}
	return a
}

func (c *cluster) createVoucher(base string, stock int) int64 {
	c.t.Helper()
	a := c.do("POST", base+"/api/v1/vouchers", token(c.t, 1, auth.RoleAdmin), map[string]any{
		"title": "fault", "face_value": 100, "stock": stock,
		"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
	})
	if a.status != http.StatusCreated {
		c.t.Fatalf("create voucher: %+v", a)
	}
	return a.order
}

// sale records what buyers were told.
type sale struct {
	mu       sync.Mutex
	accepted map[int64]int64 // order id -> user: 202, or named by already_purchased
	refused  map[int64]bool  // users told a definite no at least once
	unsure   map[int64]bool  // users with an answer that proves nothing
	won      map[int64]bool
	codes    map[string]int
}

func newSale() *sale {
	return &sale{accepted: map[int64]int64{}, refused: map[int64]bool{}, unsure: map[int64]bool{}, won: map[int64]bool{}, codes: map[string]int{}}
}

func (s *sale) record(user int64, a answer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case a.err != nil:
		s.unsure[user] = true
		s.codes["transport_error"]++
	case a.status == http.StatusAccepted:
		s.accepted[a.order], s.won[user] = user, true
		s.codes["accepted"]++
	case a.code == "already_purchased":
		// The buyer holds this order: it was accepted, maybe by a request
		// whose answer was lost, and must land.
		s.accepted[a.order], s.won[user] = user, true
		s.codes[a.code]++
	case a.status >= 500:
		s.unsure[user] = true
		s.codes[a.code]++
	default:
		s.refused[user] = true
		s.codes[a.code]++
	}
}

// input is what the invariant check needs: buyers who were only refused
// may hold nothing.
func (s *sale) input(voucherID int64) verify.Input {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := verify.Input{VoucherID: voucherID, Accepted: map[int64]int64{}, Group: group}
	for id, u := range s.accepted {
		in.Accepted[id] = u
	}
	for u := range s.refused {
		if !s.won[u] && !s.unsure[u] {
			in.Refused = append(in.Refused, u)
		}
	}
	for u := range s.unsure {
		in.Unsure = append(in.Unsure, u)
	}
	return in
}

// burst sends n purchases from users 1000.. (users repeat: n/users
// presses each, interleaved) at bases in turn, 32 at a time. during, when
// set, runs once after an eighth of them were sent, while they go on.
func (c *cluster) burst(s *sale, bases []string, voucherID int64, users, n int, during func()) {
	c.t.Helper()
	tokens := make([]string, users)
	for i := range tokens {
		tokens[i] = token(c.t, int64(1000+i), auth.RoleUser)
	}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				u := i % users
				url := fmt.Sprintf("%s/api/v1/vouchers/%d/orders", bases[i%len(bases)], voucherID)
				s.record(int64(1000+u), c.do("POST", url, tokens[u], nil))
			}
		}()
	}
	for i := range n {
		if i == n/8 && during != nil {
			during()
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
}

// quiesce waits until every invariant holds (the pipeline drained) and
// returns the report; the scenario fails with the last report otherwise.
func (c *cluster) quiesce(s *sale, voucherID int64, within time.Duration) verify.Report {
	c.t.Helper()
	g := c.openDB()
	var rep verify.Report
	deadline := time.Now().Add(within)
	for {
		var err error
		rep, err = verify.Check(context.Background(), g, c.rdb, c.keys, s.input(voucherID))
		if err == nil && rep.OK() {
			if z, _ := c.rdb.ZCard(context.Background(), c.keys.Delayed(0)).Result(); z == 0 {
				return rep
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("pipeline did not settle within %s (check error %v):\n%s", within, err, rep)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// deadLetters counts the scenario's dead letters by reason.
func (c *cluster) deadLetters() map[string]int {
	c.t.Helper()
	var rows []struct {
		Reason string
		N      int
	}
	if err := c.openDB().Raw("SELECT reason, COUNT(*) AS n FROM dead_letters GROUP BY reason").Scan(&rows).Error; err != nil {
		c.t.Fatal(err)
	}
	out := map[string]int{}
	for _, r := range rows {
		out[r.Reason] = r.N
	}
	return out
}

// report prints what a scenario injected and what it checked.
func report(t *testing.T, injected string, s *sale, rep verify.Report) {
	t.Helper()
	s.mu.Lock()
	codes := fmt.Sprint(s.codes)
	s.mu.Unlock()
	t.Logf("injected: %s\nanswers: %s\nchecked I1-I7: %s", injected, codes, rep)
}

// startLockNode starts a Redis used only for buyer locks.
func startLockNode(t *testing.T) *testenv.RedisServer {
	t.Helper()
	return testenv.StartRedis(t, testenv.RedisOptions{})
}
