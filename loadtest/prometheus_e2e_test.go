//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// promAPI queries a Prometheus server's HTTP API.
type promAPI struct{ base string }

func (p promAPI) get(ctx context.Context, path string, q url.Values, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s", path, body.Error)
	}
	return json.Unmarshal(body.Data, out)
}

// query runs an instant query and returns each series' labels.
func (p promAPI) query(ctx context.Context, expr string) ([]map[string]string, error) {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
		} `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	out := make([]map[string]string, len(data.Result))
	for i, r := range data.Result {
		out[i] = r.Metric
	}
	return out, nil
}

// alertState is the state of the named alert ("firing", "pending"), or ""
// when Prometheus holds none.
func (p promAPI) alertState(ctx context.Context, name string) (string, error) {
	var data struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	if err := p.get(ctx, "/api/v1/alerts", nil, &data); err != nil {
		return "", err
	}
	state := ""
	for _, a := range data.Alerts {
		if a.Labels["alertname"] == name && (state == "" || a.State == "firing") {
			state = a.State
		}
	}
	return state, nil
}

// dashboardQueries reads every query of the Grafana dashboard, with
// Grafana's $__rate_interval replaced by a window Prometheus understands.
func dashboardQueries(t testing.TB) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "deploy", "grafana", "dashboards", "seckill.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					out = append(out, strings.ReplaceAll(s, "$__rate_interval", "1m"))
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	if len(out) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return out
}

var byLabels = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)

// seriesName matches the service's series in a rule file.
var seriesName = regexp.MustCompile(`\bseckill_[a-z_]+\b`)

// TestPrometheusAlertFires runs the local cluster with a real Prometheus
// beside it (scripts/cluster-up.sh, SECKILL_CLUSTER_PROMETHEUS_PORT) that
// scrapes both instances and evaluates deploy/prometheus/alerts.yml. Every
// query of the Grafana dashboard has data, with the labels it groups by.
// Then MariaDB is stopped (SIGSTOP) while buyers keep coming: the order
// backlog grows and SeckillOrderBacklogGrowing must fire in Prometheus;
// MariaDB resumes and the alert must resolve; the load generator's check
// of every invariant passes after the drain.
func TestPrometheusAlertFires(t *testing.T) {
	if _, err := exec.LookPath("prometheus"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("prometheus not found (scripts/deps.sh installs it)")
		}
		t.Skip("prometheus not found: apt-get install prometheus")
	}
	c := startCluster(t,
		"SECKILL_CLUSTER_PROMETHEUS_PORT="+testenv.FreePort(t),
		"SECKILL_CLUSTER_PROMETHEUS_INTERVAL=1s",
		"SECKILL_METRICS_INTERVAL=1s",
		"SECKILL_NGINX_PURCHASE_RATE=1000000r/s", "SECKILL_NGINX_PURCHASE_BURST=1000000", "SECKILL_RATE_LIMIT=off",
		// Three shards, for a voucher of three buckets: the dashboard's
		// bucket panels have data.
		"SECKILL_SHARDS=3",
	)
	prom := promAPI{base: c.env["SECKILL_PROMETHEUS_URL"]}
	if prom.base == "" {
		t.Fatal("cluster.env has no SECKILL_PROMETHEUS_URL")
	}
	mariadb := c.pid(t, "mariadb")
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(mariadb, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT mariadbd: %v", err)
			}
		}
	}
	t.Cleanup(resume) // never leave the server stopped, whatever failed

	// Buyers at a steady 40/s for two minutes, far below the stock (a
	// voucher of three buckets), so the backlog grows for as long as the
	// database is away.
	var out testenv.Buffer
	summary := filepath.Join(t.TempDir(), "summary.json")
	cfg, opts, err := parseRun([]string{
		"--users", "4800", "--requests", "4800", "--stock", "10000", "--buckets", "3", "--rate", "40", "-c", "16",
		"--drain-timeout", "3m", "--json", summary, "--quiet",
	}, func(k string) string { return c.env[k] }, &out)
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan time.Time, 1)
	cfg.MidwayAfter = 600 // 15 s in: the dashboard's series have data by then
	cfg.Midway = func() {
		if err := syscall.Kill(mariadb, syscall.SIGSTOP); err != nil {
			t.Errorf("SIGSTOP mariadbd: %v", err)
		}
		stopped <- time.Now()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- execute(ctx, cfg, opts, &out) }()

	var at time.Time
	select {
	case at = <-stopped:
	case err := <-done:
		t.Fatalf("the load run ended before the database was stopped: %v\n%s", err, out.String())
	case <-ctx.Done():
		t.Fatal("the database was never stopped")
	}

	// Every dashboard query has data from the scraped instances.
	for _, q := range dashboardQueries(t) {
		var series []map[string]string
		testenv.WaitFor(t, 30*time.Second, "dashboard query "+q+" has data", func() bool {
			series, err = prom.query(ctx, q)
			return err == nil && len(series) > 0
		})
		for _, m := range byLabels.FindAllStringSubmatch(q, -1) {
			for l := range strings.SplitSeq(m[1], ",") {
				if l = strings.TrimSpace(l); l == "" || l == "le" {
					continue
				}
				for _, s := range series {
					if s[l] == "" {
						t.Errorf("dashboard query %q: a series without label %q: %v", q, l, s)
					}
				}
			}
		}
	}

	// Every series an alert rule reads is exported and scraped.
	rules, err := os.ReadFile(filepath.Join("..", "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, n := range seriesName.FindAllString(string(rules), -1) {
		used[n] = true
	}
	if len(used) < 8 {
		t.Fatalf("alerts.yml names %d series", len(used))
	}
	for n := range used {
		testenv.WaitFor(t, 30*time.Second, "alert series "+n+" scraped", func() bool {
			series, err := prom.query(ctx, n)
			return err == nil && len(series) > 0
		})
	}
	if ready, err := prom.query(ctx, "min(seckill_shard_ready) == 1"); err != nil || len(ready) != 1 {
		t.Errorf("seckill_shard_ready is not 1 for the loaded shard: %v, %v", ready, err)
	}

	const alert = "SeckillOrderBacklogGrowing"
	if state, err := prom.alertState(ctx, alert); err != nil || state == "firing" {
		t.Fatalf("%s before the backlog could grow for a minute: %q, %v", alert, state, err)
	}
	testenv.WaitFor(t, 4*time.Minute, alert+" firing in Prometheus", func() bool {
		state, err := prom.alertState(ctx, alert)
		return err == nil && state == "firing"
	})
	fired := time.Since(at)
	t.Logf("%s fired %s after mariadbd was stopped", alert, fired.Round(time.Second))

	resume()
	back := time.Now()
	testenv.WaitFor(t, 2*time.Minute, alert+" resolved in Prometheus", func() bool {
		state, err := prom.alertState(ctx, alert)
		return err == nil && state == ""
	})
	t.Logf("%s resolved %s after mariadbd resumed", alert, time.Since(back).Round(time.Second))

	if err := <-done; err != nil {
		t.Fatalf("load run: %v\n%s", err, out.String())
	}
	s := readSummary(t, summary)
	// A database that stopped and came back costs no order: every accepted
	// one is written, none is a dead letter.
	if s.Check == nil || !s.Check.OK || s.Check.DeadLetters != 0 || s.Check.Orders < s.Outcomes["202 accepted"] || s.Outcomes["202 accepted"] == 0 {
		t.Fatalf("check: %+v, answers %v", s.Check, s.Outcomes)
	}
}
