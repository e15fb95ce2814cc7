package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/auth"
	"seckill/internal/testenv"
)

// guarded lists the routes of both listeners, as run builds them, with a
// path to request each by: the routes that take a token among them are
// found by asking.
func guarded(t testing.TB) (main, admin []string) {
	t.Helper()
	apiR, adminR := routeEngines(t, map[string]string{"SECKILL_WEB": "on"})
	paths := func(r *gin.Engine) []string {
		var out []string
		for _, rt := range r.Routes() {
			p := strings.NewReplacer(":id", "1", "*file", "/app.js", ":name", "heap").Replace(rt.Path)
			out = append(out, rt.Method+" "+p)
		}
		slices.Sort(out)
		return out
	}
	return paths(apiR), paths(adminR)
}

// status sends method path to base with tok ("" for none) and an empty
// JSON body, and returns the status and the answer's message.
func status(t testing.TB, base, route, tok string) (int, string) {
	t.Helper()
	method, path, _ := strings.Cut(route, " ")
	a := sendJSON(t, method, base+path, tok, map[string]any{})
	msg, _ := a.body["message"].(string)
	return a.status, msg
}

// TestAdminTokensRevoked runs two instances on one Redis and one database.
// An admin token minted by "api token" works on both; once the user's
// admin tokens are revoked, from the console's route on one instance, the
// very next request with it is refused 401 on every route that takes a
// token, of both listeners of both instances (an admin token reads any
// buyer's order too, so not only the admin routes); a token minted after
// it works on both; "api token revoke" takes that one back the same way.
// Another admin's token, and the same user's buyer token, are untouched.
func TestAdminTokensRevoked(t *testing.T) {
	t.Parallel()
	shared := map[string]string{"SECKILL_MYSQL_DSN": testenv.MySQLDSN(t), "SECKILL_KEY_PREFIX": testenv.Prefix(t)}
	a, b := startObserved(t, maps.Clone(shared)), startObserved(t, maps.Clone(shared))
	instances := map[string]observed{"a": a, "b": b}
	cli := maps.Clone(shared)
	cli["SECKILL_TOKEN_SECRET"], cli["SECKILL_REDIS_URL"], cli["SECKILL_LOG_LEVEL"] = testSecret, testenv.RedisURL(t), "warn"
	mint := func(user int64, wantVersion int64) string {
		t.Helper()
		err, stdout, stderr := cliRun(cli, "token", "--user", fmt.Sprint(user), "--admin")
		if err != nil || !strings.Contains(stderr, fmt.Sprintf("token version %d", wantVersion)) {
			t.Fatalf("api token --user %d --admin: %v\n%s", user, err, stderr)
		}
		return strings.TrimSpace(stdout)
	}
	mainRoutes, adminRoutes := guarded(t)
	// works: the token is taken on an admin route of each listener of each
	// instance.
	works := func(what, tok string) {
		t.Helper()
		for name, o := range instances {
			for base, route := range map[string]string{o.base: "GET /api/v1/admin/figures", o.admin: "GET /admin/dlq"} {
				if st, msg := status(t, base, route, tok); st != http.StatusOK {
					t.Errorf("%s on %s %s: %d %s, want 200", what, name, route, st, msg)
				}
			}
		}
	}
	// refused: the token is refused as revoked on every route of both
	// listeners of both instances that refuses a request without one.
	refused := func(what, tok string) {
		t.Helper()
		n := 0
		for name, o := range instances {
			for base, routes := range map[string][]string{o.base: mainRoutes, o.admin: adminRoutes} {
				for _, route := range routes {
					if st, _ := status(t, base, route, ""); st != http.StatusUnauthorized {
						continue // takes no token
					}
					n++
					if st, msg := status(t, base, route, tok); st != http.StatusUnauthorized || !strings.Contains(msg, "revoked") {
						t.Errorf("%s on %s %s: %d %q, want 401 revoked", what, name, route, st, msg)
					}
				}
			}
		}
		// Both instances: purchases, orders, the console's admin routes
		// and the admin listener's operator routes and profiles.
		if n < 2*25 {
			t.Errorf("only %d routes of the two instances take a token: are the routers read?", n)
		}
	}

	old := mint(5, 0)
	admin1, buyer5 := token(t, 1, auth.RoleAdmin), token(t, 5, auth.RoleUser)
	works("user 5's admin token", old)

	st, body := call(t, "POST", a.base+"/api/v1/admin/users/5/revoke-tokens", admin1, nil)
	if st != http.StatusOK || body["token_version"] != float64(1) || body["user_id"] != float64(5) {
		t.Fatalf("revoke user 5's tokens from the console's route: %d %v", st, body)
	}
	refused("user 5's admin token, revoked through a's route,", old)
	fresh := mint(5, 1)
	works("user 5's admin token minted after the revocation", fresh)

	err, stdout, stderr := cliRun(cli, "token", "revoke", "--user", "5")
	var revoked struct {
		UserID       int64 `json:"user_id"`
		TokenVersion int64 `json:"token_version"`
	}
	if err != nil || json.Unmarshal([]byte(stdout), &revoked) != nil || revoked.UserID != 5 || revoked.TokenVersion != 2 {
		t.Fatalf("api token revoke --user 5: %v\n%s%s", err, stdout, stderr)
	}
	refused("user 5's second admin token, revoked by api token revoke", fresh)
	works("user 5's third admin token", mint(5, 2))

	works("user 1's admin token", admin1)
	for name, o := range instances {
		if st, _ := status(t, o.base, "GET /api/v1/users/me/orders", buyer5); st != http.StatusOK {
			t.Errorf("user 5's buyer token on %s: %d, want 200: buyers' tokens are not revoked", name, st)
		}
	}
}

// TestAdminTokenLifetimeCapped: SECKILL_ADMIN_TOKEN_MAX_TTL caps admin
// tokens. api token refuses an admin --ttl above it, naming the setting,
// and without --ttl shortens SECKILL_TOKEN_TTL to it; a buyer's token is
// not capped. The embedded mode's first-start admin token lives exactly
// the cap and works; an admin token minted elsewhere to live longer is
// refused by the service.
func TestAdminTokenLifetimeCapped(t *testing.T) {
	t.Parallel()
	lifetime := func(tok string) time.Duration { return payloadOf(t, tok).lifetime() }
	env := map[string]string{"SECKILL_TOKEN_SECRET": testSecret, "SECKILL_DATA_DIR": t.TempDir()}
	for _, c := range []struct {
		env  map[string]string
		args []string
		want time.Duration // 0: refused
	}{
		{nil, []string{"--admin", "--ttl", "25h"}, 0},
		{nil, []string{"--admin", "--ttl", "24h"}, 24 * time.Hour},
		{nil, []string{"--admin"}, 24 * time.Hour},
		{map[string]string{"SECKILL_TOKEN_TTL": "72h"}, []string{"--admin"}, 24 * time.Hour},
		{map[string]string{"SECKILL_ADMIN_TOKEN_MAX_TTL": "2h"}, []string{"--admin"}, 2 * time.Hour},
		{map[string]string{"SECKILL_ADMIN_TOKEN_MAX_TTL": "2h"}, []string{"--admin", "--ttl", "2h1s"}, 0},
		{map[string]string{"SECKILL_ADMIN_TOKEN_MAX_TTL": "2h"}, []string{"--ttl", "48h"}, 48 * time.Hour},
	} {
		e := maps.Clone(env)
		maps.Copy(e, c.env)
		err, stdout, stderr := cliRun(e, append([]string{"token", "--user", "5"}, c.args...)...)
		switch {
		case c.want == 0 && (err == nil || stdout != "" || !strings.Contains(err.Error(), "SECKILL_ADMIN_TOKEN_MAX_TTL")):
			t.Errorf("%v token %v: err %v, stdout %q; want refused, naming SECKILL_ADMIN_TOKEN_MAX_TTL", c.env, c.args, err, stdout)
		case c.want != 0 && err != nil:
			t.Errorf("%v token %v: %v\n%s", c.env, c.args, err, stderr)
		case c.want != 0 && lifetime(strings.TrimSpace(stdout)) != c.want:
			t.Errorf("%v token %v: lives %s, want %s", c.env, c.args, lifetime(strings.TrimSpace(stdout)), c.want)
		}
	}

	// The embedded mode's first start, with the cap at 2h.
	dir := t.TempDir()
	addr := freeAddr(t)
	runService(t, map[string]string{
		"SECKILL_ADDR": addr, "SECKILL_DATA_DIR": dir, "SECKILL_ADMIN_ADDR": "off", "SECKILL_LOG_LEVEL": "warn",
		"SECKILL_WORKER_BLOCK": "100ms", "SECKILL_ADMIN_TOKEN_MAX_TTL": "2h",
	})
	base := "http://" + addr
	first, err := os.ReadFile(filepath.Join(dir, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	secret, err := os.ReadFile(filepath.Join(dir, "token-secret"))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := auth.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	id, err := signer.Parse(strings.TrimSpace(string(first)))
	if p := payloadOf(t, strings.TrimSpace(string(first))); err != nil || p.lifetime() != 2*time.Hour || id.UserID != 1 || !id.Admin() {
		t.Errorf("the first start's admin token: %+v for %s, %v; want user 1's admin token for 2h", id, p.lifetime(), err)
	}
	create := func(tok string) int {
		st, _ := call(t, "POST", base+"/api/v1/vouchers", tok, map[string]any{
			"title": "capped", "face_value": 100, "stock": 1,
			"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
		})
		return st
	}
	if st := create(strings.TrimSpace(string(first))); st != http.StatusCreated {
		t.Errorf("create a voucher with the first start's admin token: %d", st)
	}
	for ttl, want := range map[time.Duration]int{2 * time.Hour: http.StatusCreated, 2*time.Hour + 2*time.Second: http.StatusUnauthorized, 30 * 24 * time.Hour: http.StatusUnauthorized} {
		tok, err := signer.Mint(auth.Identity{UserID: 1, Role: auth.RoleAdmin}, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if st := create(tok); st != want {
			t.Errorf("an admin token minted elsewhere for %s: %d, want %d", ttl, st, want)
		}
	}
}

// payload is a token's claims as written, read without checking them.
type payload struct {
	Sub      string `json:"sub"`
	Role     string `json:"role"`
	Ver      int64  `json:"ver"`
	Iat, Exp int64
}

func (p payload) lifetime() time.Duration { return time.Duration(p.Exp-p.Iat) * time.Second }

func payloadOf(t testing.TB, tok string) payload {
	t.Helper()
	parts := strings.Split(tok, ".")
	var p payload
	if len(parts) != 3 {
		t.Fatalf("%q is not a token", tok)
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || json.Unmarshal(raw, &p) != nil {
		t.Fatalf("%q: payload %s, %v", tok, raw, err)
	}
	return p
}
