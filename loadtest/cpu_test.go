package main

import (
	"bytes"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"seckill/loadtest/proc"
)

// TestPerUnit: ticks over a run, in microseconds per answer: 150 ticks at
// 100 a second over 20,000 answers is 1.5 s / 20,000 = 75 µs.
func TestPerUnit(t *testing.T) {
	t.Parallel()
	us, err := perUnit(cpuSample{1000, 50, 7}, cpuSample{1150, 53, 7}, 100, 20_000)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{75, 1.5, 0}; !slices.Equal(us, want) {
		t.Fatalf("µs per answer %v, want %v", us, want)
	}
	if us, _ := perUnit(cpuSample{0}, cpuSample{1}, 1000, 1); us[0] != 1000 {
		t.Fatalf("1 tick at 1000 Hz for one answer: %v µs, want 1000", us[0])
	}
	for _, bad := range []struct {
		before, after cpuSample
		hz            int64
		units         int
	}{
		{cpuSample{10}, cpuSample{9}, 100, 1}, // restarted
		{cpuSample{1}, cpuSample{2}, 100, 0},  // no answers
		{cpuSample{1}, cpuSample{2}, 0, 1},
		{cpuSample{1}, cpuSample{2, 3}, 100, 1},
	} {
		if _, err := perUnit(bad.before, bad.after, bad.hz, bad.units); err == nil {
			t.Errorf("perUnit(%v, %v, %d, %d): no error", bad.before, bad.after, bad.hz, bad.units)
		}
	}
}

func TestProcSpecs(t *testing.T) {
	t.Parallel()
	got, err := parseProcSpecs("service:123, redis:.cluster/run/redis.pid,database:port:13306")
	want := []procSpec{{"service", "123"}, {"redis", ".cluster/run/redis.pid"}, {"database", "port:13306"}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("parsed %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"", "123", "service:", ":123", "a:1,a:2"} {
		if _, err := parseProcSpecs(bad); err == nil {
			t.Errorf("parseProcSpecs(%q): no error", bad)
		}
	}
	f := pidsFlag{}
	for _, s := range []string{"seckill=service:1,redis:none", "bare=none"} {
		if err := f.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Set("bare=service:2"); err == nil {
		t.Error("a target's --pids given twice: no error")
	}
	if p, ok := f["bare"]; !ok || p != nil {
		t.Errorf("bare=none: %v %v", p, ok)
	}
	auto := []procSpec{{"service", "port:1"}, {"redis", "port:2"}, {"database", "port:3"}}
	merged := mergeSpecs(auto, f["seckill"])
	if want := []procSpec{{"service", "1"}, {"database", "port:3"}}; !slices.Equal(merged, want) {
		t.Errorf("merged %v, want %v", merged, want)
	}
	if merged := mergeSpecs(auto, []procSpec{{"nginx", "9"}}); len(merged) != 4 || merged[3].label != "nginx" {
		t.Errorf("an added label: %v", merged)
	}
}

// TestAutoSpecs: a loopback target is its service; the deployment's Redis
// servers, lock Redis and database on loopback are measured too, each port
// once; other hosts are not.
func TestAutoSpecs(t *testing.T) {
	t.Parallel()
	dep := deployment{
		redis: "redis://127.0.0.1:16379/0",
		locks: "redis://127.0.0.1:16380/0",
		mysql: "root@tcp(127.0.0.1:13306)/seckill",
	}
	got := autoSpecs("http://127.0.0.1:18090/bare", dep)
	want := []procSpec{{"service", "port:18090"}, {"redis", "port:16379"}, {"locks", "port:16380"}, {"database", "port:13306"}}
	if !slices.Equal(got, want) {
		t.Fatalf("auto %v, want %v", got, want)
	}
	cluster := deployment{
		redis: "redis-cluster://127.0.0.1:16400?addr=127.0.0.1:16401&addr=127.0.0.1:16400",
		locks: "redis://127.0.0.1:16400/0", // the same server as a sale's node: counted once
		mysql: "root@unix(/tmp/mysqld.sock)/seckill",
	}
	got = autoSpecs("http://seckill.example:80", cluster)
	want = []procSpec{{"redis@16400", "port:16400"}, {"redis@16401", "port:16401"}}
	if !slices.Equal(got, want) {
		t.Fatalf("auto on a cluster %v, want %v", got, want)
	}
	if got := autoSpecs("http://localhost", deployment{}); !slices.Equal(got, []procSpec{{"service", "port:80"}}) {
		t.Fatalf("localhost without a port: %v", got)
	}
	for hostport, want := range map[string]int{"127.0.0.1:1": 1, "[::1]:2": 2, "localhost:3": 3, "10.0.0.1:4": 0, "example.com:5": 0} {
		if got := loopbackPort(hostport, ""); got != want {
			t.Errorf("loopbackPort(%q) %d, want %d", hostport, got, want)
		}
	}
}

// TestResolve finds a process by pid, by pid file and by its loopback
// port; a spec naming nobody is an error, and only a given one fails
// resolveAll.
func TestResolve(t *testing.T) {
	t.Parallel()
	self := os.Getpid()
	file := filepath.Join(t.TempDir(), "api.pid")
	if err := os.WriteFile(file, []byte(strconv.Itoa(self)+" /usr/bin/api\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	for _, spec := range []string{strconv.Itoa(self), file, "port:" + port} {
		p, err := procSpec{"service", spec}.resolve()
		if err != nil || !slices.Equal(p.PIDs, []int{self}) {
			t.Errorf("%s: %+v, %v; want pid %d", spec, p, err, self)
		}
	}
	free, _ := net.Listen("tcp", "127.0.0.1:0")
	freePort := strconv.Itoa(free.Addr().(*net.TCPAddr).Port)
	free.Close()
	missing := []procSpec{{"a", "port:" + freePort}, {"b", filepath.Join(t.TempDir(), "none.pid")}, {"c", "port:x"}, {"d", "-5"}}
	for _, s := range missing {
		if _, err := s.resolve(); err == nil {
			t.Errorf("%v: no error", s)
		}
	}
	var log bytes.Buffer
	found, err := resolveAll(append(missing, procSpec{"e", file}), nil, &log, "t")
	if err != nil || len(found) != 1 || found[0].Label != "e" || strings.Count(log.String(), "not measured") != len(missing) {
		t.Errorf("found %v, %v; log %q", found, err, log.String())
	}
	if _, err := resolveAll(missing[:1], missing[:1], &log, "t"); err == nil {
		t.Error("a given process that is not found: no error")
	}
}

// TestCompareCPU: medians per process and for the total, and the ratio to
// the base target's same process, the base chosen per label.
func TestCompareCPU(t *testing.T) {
	t.Parallel()
	targets := []target{{"seckill", ""}, {"ceiling", ""}, {"bare", ""}}
	procs := []cpuProc{{Label: "service", PIDs: []int{1}}, {Label: "redis", PIDs: []int{2}}}
	mode := make([]benchResult, 3)
	runs := [][][]float64{
		{{36, 30}, {40, 31}, {38, 29}}, // seckill: service, redis per run
		{{25, 20}, {27, 22}, {26, 21}}, // ceiling
		{{28, 0}, {30, 0}, {29, 1}},    // bare
	}
	for i := range mode {
		mode[i].Name = targets[i].name
		for _, r := range runs[i] {
			mode[i].CPU = addCPURun(mode[i].CPU, procs, r)
		}
		mode[i].LoadgenRuns = []float64{30, 10, 20}
	}
	base, err := parseCPUBase("bare,redis=ceiling")
	if err != nil {
		t.Fatal(err)
	}
	compareCPU(mode, base, targets)
	s := mode[0].CPU
	if len(s) != 3 || s[2].Label != "total" || !slices.Equal(s[2].Runs, []float64{66, 71, 67}) {
		t.Fatalf("seckill rows %+v", s)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if s[0].Median != 38 || s[0].Base != "bare" || !near(s[0].Ratio, 38.0/29) {
		t.Errorf("service %+v; want median 38, 38/29 of bare", s[0])
	}
	if s[1].Median != 30 || s[1].Base != "ceiling" || !near(s[1].Ratio, 30.0/21) {
		t.Errorf("redis %+v; want median 30, 30/21 of the ceiling", s[1])
	}
	if s[2].Base != "bare" || !near(s[2].Ratio, 67.0/30) {
		t.Errorf("total %+v; want 67/30 of bare", s[2])
	}
	if b := mode[2].CPU[0]; !near(b.Ratio, 1) {
		t.Errorf("bare against itself %+v", b)
	}
	if mode[1].Loadgen != 20 {
		t.Errorf("the load generator's median %v, want 20", mode[1].Loadgen)
	}
	var out bytes.Buffer
	printCPU(&out, mode)
	for _, want := range []string{"seckill    service", "1.31x", "1.43x ceiling", "(load gen)", "10.0 20.0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}

	def, _ := parseCPUBase("")
	if got := def.of("service", targets); got != "bare" {
		t.Errorf("default base %q, want bare", got)
	}
	if got := def.of("service", targets[:2]); got != "seckill" {
		t.Errorf("default base without bare %q, want the first target", got)
	}
	for _, bad := range []string{"a,b", "=x", "redis="} {
		if _, err := parseCPUBase(bad); err == nil {
			t.Errorf("parseCPUBase(%q): no error", bad)
		}
	}
}

// TestDrainMeter: a process found when the watch begins is counted from
// there; one found only at the end (the worker, started later) from its
// start; a given one never found is an error.
func TestDrainMeter(t *testing.T) {
	t.Parallel()
	self := strconv.Itoa(os.Getpid())
	file := filepath.Join(t.TempDir(), "worker-1.pid")
	specs := []procSpec{{"service", self}, {"worker", file}}
	m := &drainMeter{specs: specs, explicit: specs, log: io.Discard}
	burnTick(t) // so that the process's time before the watch is not nothing
	m.start()
	if m.err != nil || len(m.procs) != 1 || len(m.late) != 1 {
		t.Fatalf("at the start: %+v", m)
	}
	if err := os.WriteFile(file, []byte(self+" /bin/api\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	burnTick(t)
	rows, err := m.finish(10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].Label != "service" || rows[0].SinceStart || rows[1].Label != "worker" || !rows[1].SinceStart || rows[2].Label != "total" {
		t.Fatalf("rows %+v", rows)
	}
	if rows[0].PerOrder <= 0 || rows[1].PerOrder <= rows[0].PerOrder || rows[2].PerOrder != rows[0].PerOrder+rows[1].PerOrder {
		t.Errorf("per order: service %v (> 0), worker since its start %v (more), total %v (their sum)", rows[0].PerOrder, rows[1].PerOrder, rows[2].PerOrder)
	}

	gone := []procSpec{{"worker", filepath.Join(t.TempDir(), "never.pid")}}
	m = &drainMeter{specs: gone, explicit: gone, log: io.Discard}
	m.start()
	if _, err := m.finish(10); err == nil {
		t.Error("a given process never found: no error")
	}
	m = &drainMeter{specs: gone, log: io.Discard}
	m.start()
	if rows, err := m.finish(10); err != nil || rows != nil {
		t.Errorf("a process found from the deployment and never there: %v, %v; want none", rows, err)
	}
}

// burnTick works until this process's CPU time has grown by a tick.
func burnTick(t testing.TB) {
	t.Helper()
	start, err := proc.Ticks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	for n := start; n <= start; n, _ = proc.Ticks(os.Getpid()) {
		for i := range 1_000_000 {
			x += i
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tick in 10 s of work (%d)", x)
		}
	}
}
