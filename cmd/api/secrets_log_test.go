package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"seckill/internal/auth"
	"seckill/internal/testenv"
)

// marks are the secrets of TestSecretsNeverInLogs: one distinct marker per
// credential of each secret-bearing setting (userinfo, query, fragment),
// each random, so a match can only be that setting's text.
type marks map[string]string

func newMarks(t testing.TB, names ...string) marks {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	m := marks{}
	for _, n := range names {
		m[n] = "mk" + strings.ReplaceAll(n, "_", "") + hex.EncodeToString(b[:])
	}
	return m
}

// ranOnce is what one run of the program left: its error and everything
// it wrote on stdout and stderr.
type ranOnce struct {
	name string
	err  error
	out  string
}

func (r ranOnce) all() string {
	if r.err == nil {
		return r.out
	}
	return r.out + "\nerror: " + r.err.Error() + "\nwrapped: " + fmt.Sprintf("%+v", r.err)
}

// runFailing runs the binary with exactly env and expects it to stop at
// start-up with an error. A process of its own: its output is everything
// it writes, the clients' own loggers (go-redis, the MySQL driver) on
// stderr and main's last line included.
func runFailing(t testing.TB, bin, name string, env map[string]string) ranOnce {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Dir = t.TempDir()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || ctx.Err() != nil {
		t.Errorf("%s: the program did not stop at start-up with an error (%v):\n%s", name, err, out)
	}
	return ranOnce{name: name, out: string(out)}
}

// TestSecretsNeverInLogs sets every secret-bearing setting with distinct
// markers (in userinfo, query values and fragments; the secrets and the
// DSN's password whole), runs the service through a login whose SMS
// gateway is down and a payment whose gateway is down, then through
// start-ups of the binary that fail on each of those settings (unparsable
// URLs, bad option and parameter values, a wrong Redis password,
// unreachable database hosts, a cluster lock node), and finds no marker in
// anything the program wrote or returned.
func TestSecretsNeverInLogs(t *testing.T) {
	t.Parallel()
	m := newMarks(t,
		"redis_user", "redis_pass", "redis_query", "redis_wrong",
		"lock_user", "lock_pass", "lock_query",
		"dsn_query", "token_secret",
		"gw_user", "gw_pass", "gw_query", "gw_frag", "pay_secret",
		"notify_user", "notify_pass", "notify_query",
		"sms_user", "sms_pass", "sms_query", "sms_secret",
	)
	rs := testenv.StartRedis(t, testenv.RedisOptions{ExtraArgs: []string{
		"--user", m["redis_user"], "on", ">" + m["redis_pass"], "~*", "&*", "+@all",
		"--user", m["lock_user"], "on", ">" + m["lock_pass"], "~*", "&*", "+@all",
	}})
	dsn, dbPass := passwordDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// The same server twice: a list of hosts, as a failover set-up writes it.
	multi := strings.Replace(dsn, "tcp("+cfg.Addr+")", "tcp("+cfg.Addr+","+cfg.Addr+")", 1)
	if multi == dsn {
		t.Fatalf("cannot make a list of hosts of %s", dsn)
	}
	m["dsn_pass"] = dbPass
	const phone = "+8613700000001"
	m["admin_phone"] = phone
	closed := "127.0.0.1:" + testenv.FreePort(t) // nothing listens there
	secret := m["token_secret"] + "-padding-to-32-bytes-and-more"
	addr := freeAddr(t)
	env := map[string]string{
		"SECKILL_ADDR":                  addr,
		"SECKILL_ADMIN_ADDR":            "off",
		"SECKILL_LOG_LEVEL":             "debug",
		"SECKILL_LOG_FORMAT":            "json",
		"SECKILL_WORKER_BLOCK":          "100ms",
		"SECKILL_DATA_DIR":              t.TempDir(),
		"SECKILL_KEY_PREFIX":            testenv.Prefix(t),
		"SECKILL_REDIS_URL":             fmt.Sprintf("redis://%s:%s@%s/0?client_name=%s", m["redis_user"], m["redis_pass"], rs.Addr, m["redis_query"]),
		"SECKILL_LOCK_NODES":            fmt.Sprintf("redis://%s:%s@%s/1?client_name=%s", m["lock_user"], m["lock_pass"], rs.Addr, m["lock_query"]),
		"SECKILL_MYSQL_DSN":             multi + "&connectionAttributes=program_name:" + m["dsn_query"],
		"SECKILL_TOKEN_SECRET":          secret,
		"SECKILL_PAY_PROVIDER":          "webhook",
		"SECKILL_PAY_GATEWAY_URL":       fmt.Sprintf("http://%s:%s@%s/pay?api_key=%s#%s", m["gw_user"], m["gw_pass"], closed, m["gw_query"], m["gw_frag"]),
		"SECKILL_PAY_WEBHOOK_SECRET":    m["pay_secret"],
		"SECKILL_PAY_NOTIFY_URL":        fmt.Sprintf("https://%s:%s@shop.example/api/v1/payments/notify?token=%s", m["notify_user"], m["notify_pass"], m["notify_query"]),
		"SECKILL_LOGIN_SENDER":          "webhook",
		"SECKILL_LOGIN_WEBHOOK_URL":     fmt.Sprintf("http://%s:%s@%s/sms?api_key=%s", m["sms_user"], m["sms_pass"], closed, m["sms_query"]),
		"SECKILL_LOGIN_WEBHOOK_SECRET":  m["sms_secret"],
		"SECKILL_LOGIN_WEBHOOK_TIMEOUT": "200ms",
		"SECKILL_ADMIN_PHONES":          phone,
	}
	with := func(changes map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range env {
			out[k] = v
		}
		for k, v := range changes {
			out[k] = v
		}
		return out
	}

	// A fresh database, not migrated yet: the start-up asks Redis who
	// runs before migrating it.
	fresh, freshPass := passwordDSN(t)
	m["fresh_dsn_pass"] = freshPass

	bin := testenv.Binary(t, "seckill/cmd/api")
	runs := []ranOnce{runServing(t, env, secret, phone)}
	runs = append(runs,
		runFailing(t, bin, "settings refused", with(map[string]string{
			"SECKILL_REDIS_URL":         fmt.Sprintf("redis://%s:%s@127.0.0.1:notaport/0?client_name=%s", m["redis_user"], m["redis_pass"], m["redis_query"]),
			"SECKILL_LOCK_NODES":        fmt.Sprintf("redis://%s:%s@%s/1?dial_timeout=%s", m["lock_user"], m["lock_pass"], rs.Addr, m["lock_query"]),
			"SECKILL_PAY_GATEWAY_URL":   fmt.Sprintf("ftp://%s:%s@gw.example/pay?api_key=%s", m["gw_user"], m["gw_pass"], m["gw_query"]),
			"SECKILL_PAY_NOTIFY_URL":    fmt.Sprintf("mailto:%s:%s@shop.example?token=%s", m["notify_user"], m["notify_pass"], m["notify_query"]),
			"SECKILL_LOGIN_WEBHOOK_URL": fmt.Sprintf("ftp://%s:%s@sms.example/?api_key=%s", m["sms_user"], m["sms_pass"], m["sms_query"]),
		})),
		runFailing(t, bin, "a Redis option's bad value", with(map[string]string{
			"SECKILL_REDIS_URL": fmt.Sprintf("redis://%s:%s@%s/0?dial_timeout=%s", m["redis_user"], m["redis_pass"], rs.Addr, m["redis_query"]),
		})),
		runFailing(t, bin, "Redis unreachable, a DSN parameter's bad value", with(map[string]string{
			"SECKILL_REDIS_URL": fmt.Sprintf("redis://%s:%s@%s/0?client_name=%s", m["redis_user"], m["redis_pass"], closed, m["redis_query"]),
			"SECKILL_MYSQL_DSN": fmt.Sprintf("u:%s@tcp(%s,%s)/db?parseTime=%s", m["dsn_pass"], closed, closed, m["dsn_query"]),
		})),
		runFailing(t, bin, "no database host answers", with(map[string]string{
			"SECKILL_MYSQL_DSN": fmt.Sprintf("u:%s@tcp(%s,127.0.0.1:1)/db?connectionAttributes=program_name:%s", m["dsn_pass"], closed, m["dsn_query"]),
		})),
		runFailing(t, bin, "a wrong Redis password", with(map[string]string{
			"SECKILL_REDIS_URL": fmt.Sprintf("redis://%s:%s@%s/0?client_name=%s", m["redis_user"], m["redis_wrong"], rs.Addr, m["redis_query"]),
			"SECKILL_MYSQL_DSN": fresh,
		})),
		runFailing(t, bin, "a cluster as a lock node", with(map[string]string{
			"SECKILL_LOCK_NODES": fmt.Sprintf("redis-cluster://%s:%s@%s?client_name=%s", m["lock_user"], m["lock_pass"], closed, m["lock_query"]),
		})),
	)

	// Each run went where it was meant to: the test proves nothing of a
	// path that was not taken.
	for _, want := range []struct{ run, text string }{
		{"serving", `"msg":"starting"`},
		{"serving", `"msg":"login step failed"`},
		{"serving", `"msg":"payment not started"`},
		{"settings refused", "SECKILL_REDIS_URL is refused"},
		{"settings refused", "SECKILL_LOCK_NODES is refused"},
		{"settings refused", "SECKILL_PAY_GATEWAY_URL must be"},
		{"settings refused", "SECKILL_PAY_NOTIFY_URL must be"},
		{"settings refused", "SECKILL_LOGIN_SENDER=webhook"},
		{"a Redis option's bad value", "dial_timeout"},
		{"Redis unreachable, a DSN parameter's bad value", "redis does not answer yet"},
		{"Redis unreachable, a DSN parameter's bad value", "invalid bool value"},
		{"no database host answers", "no database host takes writes"},
		{"a wrong Redis password", "WRONGPASS"},
		{"a cluster as a lock node", "not a cluster"},
	} {
		for _, r := range runs {
			if r.name == want.run && !strings.Contains(r.all(), want.text) {
				t.Errorf("%s: the output lacks %q: the path under test was not taken:\n%s", r.name, want.text, r.all())
			}
		}
	}
	for _, r := range runs {
		text := r.all()
		for what, mark := range m {
			if strings.Contains(text, mark) {
				for line := range strings.Lines(text) {
					if strings.Contains(line, mark) {
						t.Errorf("%s: %s (%s) written: %s", r.name, what, mark, strings.TrimSpace(line))
					}
				}
			}
		}
	}
}

// runServing runs the service with env, asks for a login code of phone
// (the SMS gateway is down), buys a priced voucher and pays it (the
// payment gateway is down), stops it and returns what it wrote.
func runServing(t *testing.T, env map[string]string, secret, phone string) ranOnce {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	var out testenv.Buffer
	go func() { done <- run(ctx, []string{"api"}, func(k string) string { return env[k] }, &out, &out) }()
	base := "http://" + env["SECKILL_ADDR"]
	testenv.WaitFor(t, 60*time.Second, "the service answering /healthz", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the service exited at start: %v\n%s", err, out.String())
		default:
		}
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	signer, err := auth.NewSigner([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	mint := func(user int64, role string) string {
		tok, err := signer.Mint(auth.Identity{UserID: user, Role: role}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	if st, body := call(t, "POST", base+"/api/v1/auth/code", "", map[string]any{"phone": phone}); st != http.StatusServiceUnavailable {
		t.Errorf("a login code with the SMS gateway down: %d %v, want 503", st, body)
	}
	st, body := call(t, "POST", base+"/api/v1/vouchers", mint(1, auth.RoleAdmin), map[string]any{
		"title": "priced", "face_value": 2000, "price": 1500, "stock": 1,
		"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
	})
	if st != http.StatusCreated {
		t.Fatalf("create a priced voucher: %d %v", st, body)
	}
	vid := fmt.Sprint(body["voucher"].(map[string]any)["id"])
	buyer := mint(42, auth.RoleUser)
	id := buyWritten(t, base, vid, buyer)
	if st, body := call(t, "POST", base+"/api/v1/orders/"+id+"/pay", buyer, nil); st < 500 {
		t.Errorf("pay with the gateway down: %d %v, want 5xx", st, body)
	}
	cancel()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the service did not stop within 30s")
	}
	return ranOnce{name: "serving", err: err, out: out.String()}
}
