// Package deploy holds the monitoring set-up of docker-compose.yml:
// Prometheus's scrape configuration and Grafana's provisioning and
// dashboard. Its tests check them against the metrics the service exports;
// deploy_test.go at the repository root checks them against the compose file.
package deploy

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"seckill/internal/metrics"
)

const dashboardPath = "grafana/dashboards/seckill.json"

// exported maps every series name the service exports to its label names:
// the seckill_* families (histograms as _bucket, _sum and _count) and the
// Go runtime, process and database pool ones.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	m := metrics.New()
	db, err := sql.Open("mysql", "u:p@tcp(127.0.0.1:1)/x") // never connects
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	m.WatchDB(db)
	m.WatchRedisPool(func() *redis.PoolStats { return &redis.PoolStats{} })
	m.WatchAloneWrites(func() int64 { return 0 })
	m.WatchRebuild(func() time.Duration { return 0 })

	out := map[string][]string{}
	add := func(name, typ string, labels []string) {
		if typ == "histogram" {
			out[name+"_bucket"] = append(slices.Clone(labels), "le")
			out[name+"_sum"], out[name+"_count"] = labels, labels
			return
		}
		out[name] = labels
	}
	for name, f := range m.Families() {
		add(name, f.Type, f.Labels)
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if _, ok := m.Families()[mf.GetName()]; ok {
			continue
		}
		var labels []string
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if !slices.Contains(labels, l.GetName()) {
					labels = append(labels, l.GetName())
				}
			}
		}
		typ := "other"
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM:
			typ = "histogram"
		case dto.MetricType_SUMMARY:
			out[mf.GetName()+"_sum"], out[mf.GetName()+"_count"] = labels, labels
			labels = append(labels, "quantile")
		}
		add(mf.GetName(), typ, labels)
	}
	return out
}

var (
	quoted   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	matchers = regexp.MustCompile(`\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)`)
	ranges   = regexp.MustCompile(`\[[^\]]*\]`)
	numbers  = regexp.MustCompile(`(^|[^A-Za-z0-9_:])[0-9][0-9A-Za-z.]*`) // 0.99, 1e3, 5m
	grouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	ident    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	keywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan", "atan2"}
)

// checkExported reports, for what (a panel, an alert), a query that selects
// no metric, or a metric or label the service does not export. "up" and the
// labels Prometheus adds to every series are known.
func checkExported(t *testing.T, series map[string][]string, what, expr string) {
	t.Helper()
	names, labels := parsePromQL(expr)
	if len(names) == 0 {
		t.Errorf("%s: query %q selects no metric", what, expr)
	}
	known := []string{"instance", "job"} // added by Prometheus
	for _, n := range names {
		if n == "up" {
			continue // Prometheus's own, per target
		}
		l, ok := series[n]
		if !ok {
			t.Errorf("%s queries %s, which the service does not export", what, n)
		}
		known = append(known, l...)
	}
	for _, l := range labels {
		if !slices.Contains(known, l) {
			t.Errorf("%s: query %q uses label %q, which none of its metrics has", what, expr, l)
		}
	}
}

// parsePromQL returns the metric names an expression selects and the label
// names it matches or groups by. It knows enough PromQL for dashboards:
// strings, matchers, ranges, grouping clauses, functions and operators.
func parsePromQL(expr string) (names, labels []string) {
	e := quoted.ReplaceAllString(expr, `""`)
	for _, m := range matchers.FindAllStringSubmatch(e, -1) {
		for _, l := range matcher.FindAllStringSubmatch(m[1], -1) {
			labels = append(labels, l[1])
		}
	}
	e = matchers.ReplaceAllString(e, " ")
	e = ranges.ReplaceAllString(e, " ")
	for _, g := range grouping.FindAllStringSubmatch(e, -1) {
		for l := range strings.SplitSeq(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
	}
	e = grouping.ReplaceAllString(e, " ")
	e = numbers.ReplaceAllString(e, "$1 ")
	for _, m := range ident.FindAllStringSubmatch(e, -1) {
		word := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(m[0]), "("))
		if m[1] != "" || slices.Contains(keywords, strings.ToLower(word)) {
			continue // a function, an aggregation or a keyword
		}
		names = append(names, word)
	}
	return names, labels
}

func TestParsePromQL(t *testing.T) {
	t.Parallel()
	names, labels := parsePromQL(`histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{route!="/x", method=~"P.*"}[$__rate_interval]))) / on (route) group_left b_total offset 5m`)
	if !slices.Equal(names, []string{"a_bucket", "b_total"}) {
		t.Errorf("names %v", names)
	}
	slices.Sort(labels)
	if !slices.Equal(labels, []string{"le", "method", "route", "route", "route"}) {
		t.Errorf("labels %v", labels)
	}
}

type dashboard struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int                       `json:"id"`
	Type       string                    `json:"type"`
	Title      string                    `json:"title"`
	Datasource datasource                `json:"datasource"`
	GridPos    *struct{ H, W, X, Y int } `json:"gridPos"`
	Targets    []struct {
		Expr       string     `json:"expr"`
		RefID      string     `json:"refId"`
		Datasource datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatalf("%s is not valid JSON", dashboardPath)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// provisionedUID is the uid of the Prometheus data source Grafana is given.
func provisionedUID(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("grafana/provisioning/datasources/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct {
			UID, Type, URL string
		} `yaml:"datasources"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if f.APIVersion != 1 || len(f.Datasources) != 1 || f.Datasources[0].Type != "prometheus" || f.Datasources[0].UID == "" {
		t.Fatalf("data source provisioning %+v", f)
	}
	if f.Datasources[0].URL != "http://prometheus:9090" {
		t.Errorf("data source url %q, want the compose service http://prometheus:9090", f.Datasources[0].URL)
	}
	return f.Datasources[0].UID
}

// TestDashboard: the dashboard is valid JSON that Grafana can load, every
// panel queries the provisioned Prometheus, every metric it queries is one
// the service exports with the labels it uses, and it shows what the sale
// is watched by.
func TestDashboard(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	uid := provisionedUID(t)
	series := exported(t)
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard without uid, title or panels")
	}
	var all []panel
	for _, p := range d.Panels {
		all = append(all, p)
		all = append(all, p.Panels...)
	}
	ids := map[int]bool{}
	var exprs []string
	for _, p := range all {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q has no usable gridPos", p.Title)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != uid || len(p.Targets) == 0 {
			t.Errorf("panel %q: data source %+v, %d queries; want uid %q and queries", p.Title, p.Datasource, len(p.Targets), uid)
		}
		for _, q := range p.Targets {
			if q.Datasource.UID != uid || q.RefID == "" {
				t.Errorf("panel %q query %q: data source %+v, refId %q", p.Title, q.Expr, q.Datasource, q.RefID)
			}
			exprs = append(exprs, q.Expr)
			checkExported(t, series, fmt.Sprintf("panel %q", p.Title), q.Expr)
		}
	}
	joined := strings.Join(exprs, "\n")
	for what, want := range map[string]string{
		"purchase rate by outcome": "sum by (outcome) (rate(seckill_purchases_total",
		"p99 purchase latency":     "histogram_quantile(0.99, sum by (le) (rate(seckill_purchase_duration_seconds_bucket",
		"stream lag":               "seckill_stream_lag",
		"delay-queue size":         "seckill_delay_queue_size",
		"dead letters":             "seckill_dead_letters_total",
		"shard rebuilds":           "sum by (shard, reason) (seckill_shard_rebuilds_total",
		"not_replicated answers":   `seckill_purchases_total{outcome="not_replicated"}`,
		"orders by state":          "max by (state) (seckill_orders)",
		"order moves by move":      "sum by (move) (rate(seckill_order_moves_total",
		"p99 unit back on sale":    "histogram_quantile(0.99, sum by (le) (rate(seckill_order_unit_back_seconds_bucket",
		"payments by outcome":      "sum by (outcome) (rate(seckill_payments_total",
		"payments needing refund":  "max(seckill_payments_needing_refund)",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("the dashboard does not show the %s (no query with %q)", what, want)
		}
	}
}

// TestDashboardProvider: Grafana loads dashboards from the folder
// docker-compose.yml mounts deploy/grafana/dashboards at.
func TestDashboardProvider(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("grafana/provisioning/dashboards/seckill.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		APIVersion int `yaml:"apiVersion"`
		Providers  []struct {
			Type    string
			Options struct{ Path string }
		}
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if f.APIVersion != 1 || len(f.Providers) != 1 || f.Providers[0].Type != "file" || f.Providers[0].Options.Path != "/var/lib/grafana/dashboards" {
		t.Fatalf("dashboard provider %+v", f)
	}
}
