package redact

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                              "",
		"redis://127.0.0.1:6379/0":      "redis://127.0.0.1:6379/0",
		"redis://:S3cret@r:6379/0":      "redis://xxxxx@r:6379/0",
		"redis://alice:S3cret@r:6379/0": "redis://xxxxx@r:6379/0",
		"redis://alice@r:6379/0":        "redis://xxxxx@r:6379/0",
		"rediss://u:p@r:6380/2?client_name=app&dial_timeout=1s": "rediss://xxxxx@r:6380/2?client_name=xxxxx&dial_timeout=xxxxx",
		"redis-cluster://:pw@h1:7000?addr=h2:7001&addr=h3:7002": "redis-cluster://xxxxx@h1:7000?addr=xxxxx&addr=xxxxx",
		"https://gw.example/v1/pay?api_key=K3y&sig=abc#frag":    "https://gw.example/v1/pay?api_key=xxxxx&sig=xxxxx#xxxxx",
		"https://gw.example/pay?TOKENWITHOUTKEY":                "https://gw.example/pay?xxxxx",
		"https://gw.example/pay?":                               "https://gw.example/pay?",
		"https://u:p@gw.example/a%20b":                          "https://xxxxx@gw.example/a%20b",
		"unix:///tmp/redis.sock?db=1":                           "unix:///tmp/redis.sock?db=xxxxx",
		"redis://:pa/ss@host:6379":                              "(not a URL)",
		"redis://h:6379/pa@ss":                                  "redis://h:6379/xxxxx", // a password that lost its way
		"mailto:someone@example.com":                            "mailto:xxxxx",
		"host:S3cret":                                           "host:xxxxx",
		"redis://u:S3cret@host:notaport/0":                      "(not a URL)",
		"http://[::1:bad":                                       "(not a URL)",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
	if got, want := URLs("redis://:a@n1:6379/0, redis://:b@n2:6379/0?x=y,"), "redis://xxxxx@n1:6379/0,redis://xxxxx@n2:6379/0?x=xxxxx"; got != want {
		t.Errorf("URLs = %q, want %q", got, want)
	}
}

func TestDSN(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                                     "",
		"seckill@tcp(db:3306)/seckill":         "seckill@tcp(db:3306)/seckill",
		"seckill:hunter2@tcp(db:3306)/seckill": "seckill:xxxxx@tcp(db:3306)/seckill",
		"seckill:hunter2@tcp(h1:3306,h2:3306,h3)/seckill":                         "seckill:xxxxx@tcp(h1:3306,h2:3306,h3)/seckill",
		"seckill:hunter2@tcp(h1:3306, h2:3306)/seckill?parseTime=true&tls=custom": "seckill:xxxxx@tcp(h1:3306, h2:3306)/seckill?parseTime=xxxxx&tls=xxxxx",
		"seckill:p@ss:w/rd@tcp(db)/seckill":                                       "seckill:xxxxx@tcp(db)/seckill",
		"u:pw@unix(/run/mysqld/mysqld.sock)/seckill":                              "u:xxxxx@unix(/run/mysqld/mysqld.sock)/seckill",
		"u:pw@tcp(db)/seckill?connectionAttributes=who:me@host":                   "u:xxxxx@tcp(db)/seckill?connectionAttributes=xxxxx",
		"u:pw@/seckill": "u:xxxxx@/seckill",
		"/seckill":      "/seckill",
	} {
		if got := DSN(in); got != want {
			t.Errorf("DSN(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestURLErrorScrubs: the errors url.Parse and go-redis make of a URL with
// credentials quote them; URLError takes every one out, whether the text
// parses or not, and keeps the error's identity.
func TestURLErrorScrubs(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"redis://USERMARK:PASSMARK@127.0.0.1:notaport/0?client_name=QUERYMARK",
		"redis://USERMARK:PASSMARK@127.0.0.1:6379/0?dial_timeout=QUERYMARK",
		"redis://USERMARK:PASSMARK@127.0.0.1:6379/0?QUERYMARK",
		"redis://USERMARK:PASSMARK@127.0.0.1:6379/0?pool_size=QUERYMARK%2F",
		"redis://USERMARK:PASS/MARK@127.0.0.1:6379/0",
		"http://[USERMARK:PASSMARK@bad?k=QUERYMARK",
	} {
		var err error
		if _, perr := url.Parse(raw); perr != nil {
			err = fmt.Errorf("parse: %w", perr)
		} else if _, rerr := redis.ParseURL(raw); rerr != nil {
			err = rerr
		} else {
			err = fmt.Errorf("dial %s: refused", raw)
		}
		got := URLError(err, raw).Error()
		for _, m := range []string{"USERMARK", "PASSMARK", "PASS/MARK", "QUERYMARK"} {
			if strings.Contains(got, m) {
				t.Errorf("URLError of %q (%v) still holds %s: %s", raw, err, m, got)
			}
		}
	}
	wrapped := fmt.Errorf("open redis://:SECRETPW@h/0: %w", fs.ErrNotExist)
	if got := URLError(wrapped, "redis://:SECRETPW@h/0"); !errors.Is(got, fs.ErrNotExist) || strings.Contains(got.Error(), "SECRETPW") {
		t.Errorf("URLError lost the error's identity or kept the password: %v", got)
	}
	plain := errors.New("connection refused")
	if got := URLError(plain, "redis://:SECRETPW@h/0"); got != plain {
		t.Errorf("an error that quotes nothing came back as %v", got)
	}
}

// TestDSNErrorScrubs: the driver quotes a bad parameter's value; DSNError
// takes it and the password out.
func TestDSNErrorScrubs(t *testing.T) {
	t.Parallel()
	dsn := "u:PASSMARK@tcp(127.0.0.1:1,127.0.0.1:2)/db?parseTime=QUERYMARK"
	_, err := mysql.ParseDSN(dsn)
	if err == nil || !strings.Contains(err.Error(), "QUERYMARK") {
		t.Fatalf("the driver's error no longer quotes the value (%v): the test needs another bad parameter", err)
	}
	err = fmt.Errorf("open %s: %w", dsn, err)
	got := DSNError(err, dsn).Error()
	for _, m := range []string{"PASSMARK", "QUERYMARK"} {
		if strings.Contains(got, m) {
			t.Errorf("DSNError still holds %s: %s", m, got)
		}
	}
	if !strings.Contains(got, "127.0.0.1:1,127.0.0.1:2") {
		t.Errorf("DSNError dropped the addresses: %s", got)
	}
}
