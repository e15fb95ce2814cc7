// Tests of the deployment files at the root of the repository: the
// Dockerfile, docker-compose.yml and docker-compose.cluster.yml laid over
// it, checked without a Docker engine, and their agreement with
// scripts/cluster-up.sh and the nginx template.
package seckill

import (
	"context"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v3"

	"seckill/internal/redisconn"
)

const testSecret = "compose-test-secret-0123456789abcdef"

func loadCompose(t *testing.T, env ...string) (*types.Project, error) {
	t.Helper()
	return loadComposeFiles(t, []string{"docker-compose.yml"}, env...)
}

// loadComposeFiles loads files laid over one another, as docker compose -f
// a -f b does.
func loadComposeFiles(t *testing.T, files []string, env ...string) (*types.Project, error) {
	t.Helper()
	opts, err := cli.NewProjectOptions(files,
		cli.WithWorkingDirectory("."), cli.WithEnv(env), cli.WithName("seckill"))
	if err != nil {
		t.Fatal(err)
	}
	return opts.LoadProject(context.Background())
}

func TestComposeFile(t *testing.T) {
	t.Parallel()
	p, err := loadCompose(t, "SECKILL_TOKEN_SECRET="+testSecret)
	if err != nil {
		t.Fatalf("load docker-compose.yml: %v", err)
	}
	want := []string{"api1", "api2", "grafana", "mysql", "nginx", "prometheus", "redis", "redis-locks"}
	if got := slices.Sorted(slices.Values(p.ServiceNames())); !slices.Equal(got, want) {
		t.Fatalf("services %v, want %v", got, want)
	}
	svc := func(name string) types.ServiceConfig {
		s, err := p.GetService(name)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	needHealthy := func(s types.ServiceConfig, deps ...string) {
		t.Helper()
		for _, d := range deps {
			dep, ok := s.DependsOn[d]
			if !ok || dep.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s must wait for %s to be healthy, has %+v", s.Name, d, dep)
			}
		}
	}
	hasHealthcheck := func(s types.ServiceConfig) {
		t.Helper()
		if s.HealthCheck == nil || s.HealthCheck.Disable || len(s.HealthCheck.Test) < 2 {
			t.Errorf("%s has no health check", s.Name)
		}
	}

	redis := svc("redis")
	hasHealthcheck(redis)
	cmd := strings.Join(redis.Command, " ")
	for _, flag := range []string{"--appendonly yes", "--appendfsync always", "--maxmemory-policy noeviction"} {
		if !strings.Contains(cmd, flag) {
			t.Errorf("redis command %q lacks %q", cmd, flag)
		}
	}
	if !strings.HasPrefix(redis.Image, "redis:7") {
		t.Errorf("redis image %q, want redis:7.x", redis.Image)
	}
	// Buyer locks need no durability: a Redis of their own without AOF, so
	// that no lock write waits for an fsync.
	locks := svc("redis-locks")
	hasHealthcheck(locks)
	if locks.Image != redis.Image {
		t.Errorf("redis-locks image %q, want the main Redis's %q", locks.Image, redis.Image)
	}
	if c := locks.Command; !hasArgs(c, "--appendonly", "no") || !hasArgs(c, "--save", "") || slices.Contains(c, "--appendfsync") {
		t.Errorf("redis-locks command %q: want --appendonly no and --save \"\"", c)
	}
	mysql := svc("mysql")
	hasHealthcheck(mysql)
	if !strings.HasPrefix(mysql.Image, "mysql:8") {
		t.Errorf("mysql image %q, want mysql:8.x", mysql.Image)
	}
	if !slices.Contains(mysql.Command, "--innodb-flush-log-at-trx-commit=1") {
		t.Errorf("mysql command %q does not flush InnoDB at every commit", mysql.Command)
	}
	if !slices.Contains(mysql.Command, "--log-bin-trust-function-creators=1") {
		t.Errorf("mysql command %q: the service's account cannot create the draw commitment's trigger", mysql.Command)
	}
	if len(redis.Volumes) == 0 || len(mysql.Volumes) == 0 {
		t.Error("redis and mysql must keep their data in volumes")
	}

	var apis []string
	for _, name := range []string{"api1", "api2"} {
		s := svc(name)
		apis = append(apis, name)
		hasHealthcheck(s)
		needHealthy(s, "redis", "redis-locks", "mysql")
		if s.Build == nil || s.Build.Context == "" {
			t.Errorf("%s is not built from the Dockerfile", name)
		}
		env := func(k string) string {
			if v := s.Environment[k]; v != nil {
				return *v
			}
			return ""
		}
		if env("SECKILL_TOKEN_SECRET") != testSecret {
			t.Errorf("%s: SECKILL_TOKEN_SECRET is %q, want the one from the environment", name, env("SECKILL_TOKEN_SECRET"))
		}
		if env("SECKILL_REDIS_URL") != "redis://redis:6379/0" || !strings.Contains(env("SECKILL_MYSQL_DSN"), "@tcp(mysql:3306)/seckill") {
			t.Errorf("%s: stores %q and %q", name, env("SECKILL_REDIS_URL"), env("SECKILL_MYSQL_DSN"))
		}
		if env("SECKILL_LOCK_NODES") != "redis://redis-locks:6379/0" {
			t.Errorf("%s: SECKILL_LOCK_NODES is %q, want the lock Redis", name, env("SECKILL_LOCK_NODES"))
		}
		if len(s.Ports) != 0 {
			t.Errorf("%s publishes ports %v; only nginx should", name, s.Ports)
		}
		if s.StopGracePeriod == nil {
			t.Errorf("%s: no stop_grace_period for the worker's batch in flight", name)
		}
	}

	nginx := svc("nginx")
	hasHealthcheck(nginx)
	// The instances trust client-address headers from nginx only.
	var nginxIP string
	for _, n := range nginx.Networks {
		if n != nil && n.Ipv4Address != "" {
			nginxIP = n.Ipv4Address
		}
	}
	if nginxIP == "" {
		t.Error("nginx has no fixed address for the instances to trust")
	}
	for _, name := range apis {
		if v := svc(name).Environment["SECKILL_TRUSTED_PROXIES"]; v == nil || *v != nginxIP {
			t.Errorf("%s: SECKILL_TRUSTED_PROXIES must be nginx's address %s", name, nginxIP)
		}
	}
	needHealthy(nginx, apis...)
	if len(nginx.Ports) != 1 || nginx.Ports[0].Target != 8080 || nginx.Ports[0].Published != "8080" {
		t.Errorf("nginx ports %+v, want 8080:8080", nginx.Ports)
	}
	var mounted bool
	for _, v := range nginx.Volumes {
		if v.Target == "/etc/nginx/templates/default.conf.template" && strings.HasSuffix(v.Source, "nginx/seckill.conf.template") {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("nginx does not mount nginx/seckill.conf.template as its template: %+v", nginx.Volumes)
	}
	// Every placeholder of the template has a value (the balancer's
	// addresses may be none, but the name must be set: the image's
	// envsubst leaves an unset name as it is), and the upstream names
	// every instance.
	for _, name := range placeholders(t) {
		if v := nginx.Environment[name]; v == nil || (*v == "" && name != "SECKILL_NGINX_REAL_IP_FROM") {
			t.Errorf("nginx environment lacks %s, a placeholder of the template", name)
		}
	}
	if v := nginx.Environment["SECKILL_NGINX_REAL_IP_FROM"]; v != nil && *v != "" {
		t.Errorf("nginx trusts a balancer by default (%q): compose publishes nginx's port to clients itself", *v)
	}
	if up := nginx.Environment["SECKILL_UPSTREAM_SERVERS"]; up != nil {
		for _, a := range apis {
			if !strings.Contains(*up, "server "+a+":8080") {
				t.Errorf("upstream %q lacks %s", *up, a)
			}
		}
	}
}

// TestComposeNeedsSecret: without SECKILL_TOKEN_SECRET the project does not
// load, rather than starting instances that cannot mint or check tokens.
func TestComposeNeedsSecret(t *testing.T) {
	t.Parallel()
	_, err := loadCompose(t)
	if err == nil || !strings.Contains(err.Error(), "SECKILL_TOKEN_SECRET") {
		t.Fatalf("loading without SECKILL_TOKEN_SECRET: %v", err)
	}
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	if n := len(regexp.MustCompile(`(?m)^FROM `).FindAllString(df, -1)); n < 2 {
		t.Errorf("Dockerfile has %d stages, want a build stage and a runtime stage", n)
	}
	for _, want := range []string{"CGO_ENABLED=0", "COPY --from=build", "./cmd/api"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	users := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindAllStringSubmatch(df, -1)
	if len(users) == 0 {
		t.Fatal("Dockerfile sets no USER: the service would run as root")
	}
	if u := users[len(users)-1][1]; u == "root" || u == "0" || strings.HasPrefix(u, "0:") {
		t.Errorf("Dockerfile runs as %s", u)
	}
}

// TestDockerfileCopiesTheBuild: the build stage copies every file the
// binary is built from: each Go file and each embedded file (openapi.yaml,
// the Lua scripts, the migrations, the web assets) of every package of
// this module that ./cmd/api needs, as go list reports them for the
// Dockerfile's GOOS and CGO_ENABLED, and go.mod and go.sum. A package
// whose directory is not copied fails the image's build, and no Docker
// engine is needed to see it.
func TestDockerfileCopiesTheBuild(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var copied []string // sources the build stage copies, relative to the context
	stages := 0
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			stages++
		case "COPY":
			if stages != 1 {
				continue
			}
			var args []string
			for _, a := range f[1:] {
				if strings.HasPrefix(a, "--from") {
					args = nil
					break
				}
				if !strings.HasPrefix(a, "--") {
					args = append(args, a)
				}
			}
			if len(args) >= 2 {
				for _, src := range args[:len(args)-1] {
					copied = append(copied, path.Clean(src))
				}
			}
		}
	}
	if len(copied) == 0 {
		t.Fatal("the Dockerfile's build stage copies nothing")
	}
	isCopied := func(file string) bool {
		for _, c := range copied {
			if c == "." || file == c || strings.HasPrefix(file, c+"/") {
				return true
			}
		}
		return false
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-f",
		`{{if and .Module (eq .Module.Path "seckill")}}{{range .GoFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}{{end}}`,
		"./cmd/api")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	files := []string{"go.mod", "go.sum"}
	embeds := 0
	for line := range strings.Lines(string(out)) {
		rel, err := filepath.Rel(root, strings.TrimSpace(line))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(rel, ".go") {
			embeds++
		}
		files = append(files, filepath.ToSlash(rel))
	}
	if embeds == 0 || len(files) < 20 {
		t.Fatalf("go list named %d files, %d embedded: is it read?", len(files), embeds)
	}
	for _, f := range files {
		if !isCopied(f) {
			t.Errorf("the Dockerfile's build stage does not copy %s, which the binary is built from", f)
		}
	}
}

// TestClusterScriptMatchesCompose: the local cluster runs Redis with the same
// durability flags, buyer locks on a second Redis without persistence like
// compose's redis-locks, and fills every placeholder of the nginx template.
func TestClusterScriptMatchesCompose(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("scripts/cluster-up.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	for _, want := range []string{"--appendonly yes", "--appendfsync always", "--maxmemory-policy noeviction", "--innodb-flush-log-at-trx-commit=1"} {
		if !strings.Contains(script, want) {
			t.Errorf("cluster-up.sh lacks %q", want)
		}
	}
	// The lock Redis is started without persistence and handed to the
	// instances; cluster-down.sh stops it.
	if start := command(script, "start redis-locks "); start == "" {
		t.Error("cluster-up.sh starts no redis-locks")
	} else if !strings.Contains(start, `--appendonly no`) || !strings.Contains(start, `--save ""`) || strings.Contains(start, "--appendfsync") {
		t.Errorf("cluster-up.sh starts the lock Redis with persistence: %q", start)
	}
	if !regexp.MustCompile(`export SECKILL_LOCK_NODES="redis://127\.0\.0\.1:\$lock_redis_port/0"`).MatchString(script) ||
		!strings.Contains(script, `echo "SECKILL_LOCK_NODES='$SECKILL_LOCK_NODES'"`) {
		t.Error("cluster-up.sh does not give the instances and cluster.env SECKILL_LOCK_NODES on the lock Redis")
	}
	if down, err := os.ReadFile("scripts/cluster-down.sh"); err != nil {
		t.Error(err)
	} else if !regexp.MustCompile(`(?m)^\s*stop redis-locks$`).Match(down) {
		t.Error("cluster-down.sh does not stop redis-locks")
	}
	for _, name := range placeholders(t) {
		if !strings.Contains(script, `s|\${`+name+`}|`) {
			t.Errorf("cluster-up.sh does not fill %s", name)
		}
	}
	// Behind an L4 balancer nginx reads the PROXY protocol on its listener
	// and is checked through it.
	if !regexp.MustCompile(`if \[ "\$real_ip_header" = proxy_protocol \]; then\n(\s*#.*\n)*\s*nginx_listen\+=" proxy_protocol"\n\s*nginx_check=\(proxy\)`).MatchString(script) {
		t.Error("cluster-up.sh does not listen with proxy_protocol when SECKILL_NGINX_REAL_IP_HEADER is proxy_protocol")
	}
}

// TestClusterScriptListeners: every service instance the local cluster
// starts gets its own loopback addresses, an admin address that is free or
// off (an address given but taken stops an instance at start), and a worker
// is waited for on its /readyz like the others.
func TestClusterScriptListeners(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("scripts/cluster-up.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	// Each start of an instance, with the continued lines before it that
	// give its environment.
	starts := regexp.MustCompile(`(?:[^\n]*\\\n)*[^\n]*\bstart "?(?:api|worker)[^\n]*`).FindAllString(script, -1)
	if len(starts) < 4 { // worker, api-solo, api-$i twice (GOMAXPROCS or not)
		t.Fatalf("found %d instance starts in cluster-up.sh", len(starts))
	}
	for _, cmd := range starts {
		if !regexp.MustCompile(`SECKILL_ADDR="127\.0\.0\.1:\$`).MatchString(cmd) {
			t.Errorf("an instance is not given a loopback SECKILL_ADDR: %s", cmd)
		}
		if !regexp.MustCompile(`SECKILL_ADMIN_ADDR="(\$\{SECKILL_ADMIN_ADDR:-\$\(admin_addr "\$port"\)\}|\$admin_listen|\$solo_admin)"`).MatchString(cmd) {
			t.Errorf("an instance's admin address does not come from admin_addr: %s", cmd)
		}
	}
	if !regexp.MustCompile(`wait_for "worker-\$n" \d+ "worker-\$n" http_ok "\$port" /readyz`).MatchString(script) {
		t.Error("cluster-up.sh worker does not wait for the worker's /readyz")
	}
}

// hasArgs: args holds want as consecutive elements.
func hasArgs(args []string, want ...string) bool {
	for i := range args {
		if i+len(want) <= len(args) && slices.Equal(args[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

// command is the shell command of script whose line begins with prefix,
// continuation lines joined; empty if there is none.
func command(script, prefix string) string {
	var cmd strings.Builder
	for _, line := range strings.Split(script, "\n") {
		if cmd.Len() == 0 && !strings.HasPrefix(line, prefix) {
			continue
		}
		body, more := strings.CutSuffix(line, "\\")
		cmd.WriteString(body)
		if !more {
			break
		}
	}
	return cmd.String()
}

// placeholders lists the ${NAME}s of the nginx template.
func placeholders(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("nginx/seckill.conf.template")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`\$\{([A-Z0-9_]+)\}`).FindAllStringSubmatch(string(b), -1) {
		if !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	if len(names) == 0 {
		t.Fatal("no placeholders found in the nginx template")
	}
	return names
}

// TestComposeMonitoring: Prometheus scrapes /metrics of exactly the API
// instances, Grafana gets the provisioned data source and dashboards from
// deploy/, and both publish on loopback only.
func TestComposeMonitoring(t *testing.T) {
	t.Parallel()
	p, err := loadCompose(t, "SECKILL_TOKEN_SECRET="+testSecret)
	if err != nil {
		t.Fatalf("load docker-compose.yml: %v", err)
	}
	var apis []string
	for _, s := range p.Services {
		if s.Build != nil {
			apis = append(apis, s.Name)
		}
	}
	slices.Sort(apis)
	if len(apis) == 0 {
		t.Fatal("no API service is built from the Dockerfile")
	}
	mounts := func(s types.ServiceConfig, source, target string) bool {
		for _, v := range s.Volumes {
			if v.Target == target && strings.HasSuffix(v.Source, source) && v.ReadOnly {
				return true
			}
		}
		return false
	}
	loopbackOnly := func(s types.ServiceConfig, target uint32) {
		t.Helper()
		if len(s.Ports) != 1 || s.Ports[0].Target != target || s.Ports[0].HostIP != "127.0.0.1" {
			t.Errorf("%s ports %+v, want %d published on 127.0.0.1 only", s.Name, s.Ports, target)
		}
	}

	prom, err := p.GetService("prometheus")
	if err != nil {
		t.Fatal(err)
	}
	if !mounts(prom, "deploy/prometheus/prometheus.yml", "/etc/prometheus/prometheus.yml") ||
		!slices.Contains(prom.Command, "--config.file=/etc/prometheus/prometheus.yml") {
		t.Errorf("prometheus does not read deploy/prometheus/prometheus.yml: %v %+v", prom.Command, prom.Volumes)
	}
	if prom.HealthCheck == nil || len(prom.HealthCheck.Test) < 2 {
		t.Error("prometheus has no health check")
	}
	loopbackOnly(prom, 9090)

	b, err := os.ReadFile("deploy/prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("deploy/prometheus/prometheus.yml: %v", err)
	}
	var targets []string
	for _, sc := range cfg.ScrapeConfigs {
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("job %s scrapes %s, want /metrics", sc.JobName, sc.MetricsPath)
		}
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	slices.Sort(targets)
	var want []string
	for _, a := range apis {
		s, _ := p.GetService(a)
		port := "8080"
		if v := s.Environment["SECKILL_ADDR"]; v != nil {
			_, port, _ = strings.Cut(*v, ":")
		}
		want = append(want, a+":"+port)
	}
	if !slices.Equal(targets, want) {
		t.Errorf("prometheus scrapes %v, want every API instance %v", targets, want)
	}

	graf, err := p.GetService("grafana")
	if err != nil {
		t.Fatal(err)
	}
	if !mounts(graf, "deploy/grafana/provisioning", "/etc/grafana/provisioning") ||
		!mounts(graf, "deploy/grafana/dashboards", "/var/lib/grafana/dashboards") {
		t.Errorf("grafana does not mount deploy/grafana: %+v", graf.Volumes)
	}
	if dep, ok := graf.DependsOn["prometheus"]; !ok || dep.Condition != types.ServiceConditionHealthy {
		t.Errorf("grafana must wait for a healthy prometheus, has %+v", graf.DependsOn)
	}
	loopbackOnly(graf, 3000)
}

// clusterNodes are the Redis Cluster's services in docker-compose.cluster.yml.
var clusterNodes = []string{"redis-node-1", "redis-node-2", "redis-node-3", "redis-node-4", "redis-node-5", "redis-node-6"}

// TestComposeClusterFile: docker-compose.cluster.yml over docker-compose.yml
// runs the sale on a Redis Cluster of six durable nodes instead of the one
// Redis; a one-shot service creates the cluster from every node with one
// replica per master; the instances wait for it and open it through a
// redis-cluster:// URL naming every node, with one shard per master.
func TestComposeClusterFile(t *testing.T) {
	t.Parallel()
	p, err := loadComposeFiles(t, []string{"docker-compose.yml", "docker-compose.cluster.yml"}, "SECKILL_TOKEN_SECRET="+testSecret)
	if err != nil {
		t.Fatalf("load docker-compose.yml with docker-compose.cluster.yml: %v", err)
	}
	want := append([]string{"api1", "api2", "grafana", "mysql", "nginx", "prometheus", "redis-cluster-init", "redis-locks"}, clusterNodes...)
	slices.Sort(want)
	if got := slices.Sorted(slices.Values(p.ServiceNames())); !slices.Equal(got, want) {
		t.Fatalf("services %v, want %v (and no single redis)", got, want)
	}
	svc := func(name string) types.ServiceConfig {
		s, err := p.GetService(name)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	locks := svc("redis-locks")

	// Each node: cluster mode, the single Redis's durability, its data in a
	// volume, a health check, and an address of its own that stays the same
	// when the container is recreated.
	ips := map[string]string{}
	for _, name := range clusterNodes {
		s := svc(name)
		if s.Image != locks.Image {
			t.Errorf("%s image %q, want the lock Redis's %q", name, s.Image, locks.Image)
		}
		for _, args := range [][]string{
			{"--cluster-enabled", "yes"}, {"--appendonly", "yes"}, {"--appendfsync", "always"},
			{"--maxmemory-policy", "noeviction"}, {"--cluster-require-full-coverage", "no"},
		} {
			if !hasArgs(s.Command, args...) {
				t.Errorf("%s command %q lacks %q", name, s.Command, args)
			}
		}
		if s.HealthCheck == nil || s.HealthCheck.Disable || len(s.HealthCheck.Test) < 2 {
			t.Errorf("%s has no health check", name)
		}
		if len(s.Volumes) != 1 || s.Volumes[0].Target != "/data" || s.Volumes[0].Type != types.VolumeTypeVolume {
			t.Errorf("%s does not keep /data (AOF, nodes.conf) in a volume: %+v", name, s.Volumes)
		}
		if len(s.Ports) != 0 {
			t.Errorf("%s publishes ports %v", name, s.Ports)
		}
		n := s.Networks["backend"]
		if n == nil || n.Ipv4Address == "" {
			t.Errorf("%s has no fixed address on the backend network", name)
			continue
		}
		for other, ip := range ips {
			if ip == n.Ipv4Address {
				t.Errorf("%s and %s share the address %s", name, other, ip)
			}
		}
		ips[name] = n.Ipv4Address
	}

	// The one-shot creation: after every node is healthy, from all six,
	// one replica per master, without asking.
	initSvc := svc("redis-cluster-init")
	for _, name := range clusterNodes {
		if dep, ok := initSvc.DependsOn[name]; !ok || dep.Condition != types.ServiceConditionHealthy {
			t.Errorf("redis-cluster-init must wait for %s to be healthy, has %+v", name, dep)
		}
	}
	if initSvc.Restart != "no" {
		t.Errorf("redis-cluster-init restart %q, want no: it runs once", initSvc.Restart)
	}
	script := strings.Join(append(slices.Clone(initSvc.Entrypoint), initSvc.Command...), " ")
	for _, want := range []string{"redis-cli --cluster create", "--cluster-replicas 1", "--cluster-yes", "cluster_state:ok", "master_link_status:up"} {
		if !strings.Contains(script, want) {
			t.Errorf("redis-cluster-init lacks %q: %s", want, script)
		}
	}
	var nodeIPs []string
	if v := initSvc.Environment["NODES"]; v != nil {
		nodeIPs = strings.Fields(*v)
	}
	if !slices.Equal(nodeIPs, slices.Collect(func(yield func(string) bool) {
		for _, name := range clusterNodes {
			if !yield(ips[name]) {
				return
			}
		}
	})) {
		t.Errorf("redis-cluster-init creates the cluster from %v, want every node's address %v", nodeIPs, ips)
	}

	// The instances: the cluster URL with every node as a seed, one shard
	// per master, started once the cluster is created.
	for _, name := range []string{"api1", "api2"} {
		s := svc(name)
		env := func(k string) string {
			if v := s.Environment[k]; v != nil {
				return *v
			}
			return ""
		}
		target, err := redisconn.Parse(env("SECKILL_REDIS_URL"))
		if err != nil || !target.IsCluster() {
			t.Errorf("%s: SECKILL_REDIS_URL %q is no Redis Cluster URL: %v", name, env("SECKILL_REDIS_URL"), err)
		} else {
			var seeds []string
			for _, n := range clusterNodes {
				seeds = append(seeds, n+":6379")
			}
			if got := slices.Sorted(slices.Values(target.Cluster.Addrs)); !slices.Equal(got, seeds) {
				t.Errorf("%s: the cluster URL names %v, want every node %v", name, got, seeds)
			}
		}
		if env("SECKILL_SHARDS") != "3" {
			t.Errorf("%s: SECKILL_SHARDS %q, want 3, one per master", name, env("SECKILL_SHARDS"))
		}
		if dep, ok := s.DependsOn["redis-cluster-init"]; !ok || dep.Condition != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("%s must wait for redis-cluster-init to complete, has %+v", name, s.DependsOn)
		}
		if _, ok := s.DependsOn["redis"]; ok {
			t.Errorf("%s waits for the single redis, which the cluster set-up leaves out", name)
		}
		for _, d := range []string{"redis-locks", "mysql"} {
			if dep, ok := s.DependsOn[d]; !ok || dep.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s must wait for %s to be healthy, has %+v", name, d, dep)
			}
		}
		// The rest is docker-compose.yml's.
		if env("SECKILL_TOKEN_SECRET") != testSecret || env("SECKILL_LOCK_NODES") != "redis://redis-locks:6379/0" ||
			!strings.Contains(env("SECKILL_MYSQL_DSN"), "@tcp(mysql:3306)/seckill") || s.Build == nil {
			t.Errorf("%s lost docker-compose.yml's settings: %v", name, s.Environment)
		}
	}
}

// TestClusterScriptRedisCluster: SECKILL_CLUSTER_REDIS=cluster starts six
// nodes with the flags compose's nodes have, creates the cluster with one
// replica per master, waits for it, hands the instances a redis-cluster://
// URL with three shards, and cluster-down.sh stops every node.
func TestClusterScriptRedisCluster(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("scripts/cluster-up.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	start := command(script, `    start "redis-node-$i" `)
	if start == "" {
		t.Fatal("cluster-up.sh starts no redis-node-$i")
	}
	p, err := loadComposeFiles(t, []string{"docker-compose.yml", "docker-compose.cluster.yml"}, "SECKILL_TOKEN_SECRET="+testSecret)
	if err != nil {
		t.Fatal(err)
	}
	node, err := p.GetService(clusterNodes[0])
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(node.Command); i += 2 {
		flag, val := node.Command[i], node.Command[i+1]
		if val == "" {
			val = `""`
		}
		if !strings.Contains(start, flag+" "+val) && !strings.Contains(start, flag+` "`+val+`"`) {
			t.Errorf("cluster-up.sh starts its nodes without compose's %s %s: %s", flag, val, start)
		}
	}
	for _, want := range []string{
		"--cluster-replicas 1 --cluster-yes", "cluster_state", "master_link_status:up",
		`export SECKILL_REDIS_URL=$cluster_url`, `export SECKILL_SHARDS=${SECKILL_SHARDS:-3}`,
		`cluster_url="redis-cluster://127.0.0.1:`,
	} {
		if !strings.Contains(script, want) {
			t.Errorf("cluster-up.sh lacks %q", want)
		}
	}
	if down, err := os.ReadFile("scripts/cluster-down.sh"); err != nil {
		t.Error(err)
	} else if !strings.Contains(string(down), `"$run"/redis-node-*.pid`) {
		t.Error("cluster-down.sh does not stop the Redis Cluster's nodes")
	}
}

// TestClusterScriptReplicatedDatabase: SECKILL_CLUSTER_DB=semisync starts
// a primary and a replica with the binary log, GTIDs and semi-synchronous
// replication waiting AFTER_SYNC, the replica read-only and replicating by
// GTID; galera starts three nodes, the first bootstrapping, each on ports
// of its own, with the state transfer that works as root; start-up waits
// for the replica's connection or every node Synced; the instances and
// cluster.env get one DSN naming every server; cluster-down.sh stops them.
func TestClusterScriptReplicatedDatabase(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("scripts/cluster-up.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	fn := regexp.MustCompile(`(?s)\ndb_start\(\) \{\n(.*?)\n\}\n`).FindStringSubmatch(script)
	if fn == nil {
		t.Fatal("cluster-up.sh has no db_start function")
	}
	arm := func(label string) string {
		_, rest, ok := strings.Cut(fn[1], "\n    "+label+")\n")
		if !ok {
			t.Errorf("db_start has no %s) arm", label)
			return ""
		}
		body, _, _ := strings.Cut(rest, "\n      ;;")
		return body
	}
	// Every server gets the single server's options.
	for _, want := range []string{"--innodb-flush-log-at-trx-commit=1", "--bind-address=127.0.0.1", `--port="$port"`, `start "mariadb-$i"`} {
		if !strings.Contains(fn[1], want) {
			t.Errorf("db_start lacks %q", want)
		}
	}
	semisync := arm("primary | replica")
	for _, want := range []string{
		`--server-id="$i"`, "--log-bin=", "--binlog-format=ROW", "--log-slave-updates=ON", "--gtid-strict-mode=ON",
		"--sync-binlog=1", "--rpl-semi-sync-slave-enabled=ON", "--rpl-semi-sync-master-wait-point=AFTER_SYNC",
		`--rpl-semi-sync-master-timeout="$semisync_timeout"`, "--rpl-semi-sync-master-enabled=ON --read-only=OFF",
		"--read-only=ON --skip-slave-start",
	} {
		if !strings.Contains(semisync, want) {
			t.Errorf("db_start's semisync servers lack %q", want)
		}
	}
	galera := arm("galera")
	for _, want := range []string{
		"--wsrep-on=ON", `--wsrep-provider="$galera_provider"`, "--binlog-format=ROW", "--innodb-autoinc-lock-mode=2",
		"gmcast.listen_addr=tcp://127.0.0.1:${galera_ports[", "ist.recv_addr=127.0.0.1:${ist_ports[",
		"--wsrep-sst-method=mysqldump", "--wsrep-sst-auth=root:", `--wsrep-sst-receive-address="127.0.0.1:$port"`,
	} {
		if !strings.Contains(galera, want) {
			t.Errorf("db_start's Galera nodes lack %q", want)
		}
	}
	for _, want := range []string{
		`SECKILL_CLUSTER_SEMISYNC_TIMEOUT_MS:-10000`, `galera_provider=/usr/lib/galera/libgalera_smm.so`,
		"MASTER_USE_GTID=slave_pos", "semisync_clients $((${#db_ports[@]} - 1))", // Rpl_semi_sync_master_clients
		`db_start "$db_primary" galera --wsrep-new-cluster`, "galera_synced ${#db_ports[@]}", "safe_to_bootstrap",
		"STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only=OFF", "MASTER_GTID_WAIT",
		// One DSN naming every server, in port order, for the instances and cluster.env.
		`db_hosts=$(printf '127.0.0.1:%s,' "${db_ports[@]}" | sed 's/,$//')`,
		`export SECKILL_MYSQL_DSN="root@tcp($db_hosts)/seckill"`, `echo "SECKILL_MYSQL_DSN='$SECKILL_MYSQL_DSN'"`,
	} {
		if !strings.Contains(script, want) {
			t.Errorf("cluster-up.sh lacks %q", want)
		}
	}
	if strings.Contains(script, "--wsrep-sst-method=rsync") {
		t.Error("cluster-up.sh uses rsync state transfer, which fails when mariadbd runs as root")
	}
	// Each mode's server count and its ports checked like every other port.
	for _, want := range []string{"single) db_servers=1", "semisync) db_servers=2", "galera) db_servers=3"} {
		if !strings.Contains(script, want) {
			t.Errorf("cluster-up.sh lacks %q", want)
		}
	}
	if !regexp.MustCompile(`for p in [^\n]*"\$\{db_ports\[@\]\}" "\$\{galera_ports\[@\]\}" "\$\{ist_ports\[@\]\}"[^\n]*; do\n[^\n]*is no port`).MatchString(script) {
		t.Error("cluster-up.sh does not check the database servers' ports (SQL, group communication, IST) like the others")
	}
	if down, err := os.ReadFile("scripts/cluster-down.sh"); err != nil {
		t.Error(err)
	} else if !regexp.MustCompile(`for i in 3 2 1; do\n\s*stop "mariadb-\$i"`).Match(down) {
		t.Error("cluster-down.sh does not stop the replicated database's servers one at a time")
	}
}

// TestClusterScriptDocumentsSettings: every SECKILL_CLUSTER_* setting the
// script reads is described in its header, and each subcommand it answers
// is listed there.
func TestClusterScriptDocumentsSettings(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("scripts/cluster-up.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	header, _, ok := strings.Cut(script, "\nset -euo pipefail\n")
	if !ok {
		t.Fatal("cluster-up.sh has no set -euo pipefail after its header")
	}
	read := regexp.MustCompile(`\$\{(SECKILL_CLUSTER_[A-Z0-9_]+)`).FindAllStringSubmatch(script, -1)
	if len(read) < 10 {
		t.Fatalf("found %d settings read: is the script read?", len(read))
	}
	for _, m := range read {
		if !regexp.MustCompile(`(?m)^#.*\b` + m[1] + `\b`).MatchString(header) {
			t.Errorf("cluster-up.sh reads %s, which its header does not describe", m[1])
		}
	}
	for _, m := range regexp.MustCompile(`if \[ "\$\{1:-\}" = "([a-z-]+)" \]; then`).FindAllStringSubmatch(script, -1) {
		if !strings.Contains(header, "#   scripts/cluster-up.sh "+m[1]+" ") {
			t.Errorf("cluster-up.sh answers %s, which its header does not list", m[1])
		}
	}
}
