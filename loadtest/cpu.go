package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"seckill/internal/db"
	"seckill/loadtest/load"
	"seckill/loadtest/proc"
)

// CPU per answer: the CPU time (utime + stime of /proc/<pid>/stat) each
// process of a target used during a measured run, divided by the run's
// answers. The processes are given as label:spec (service:123,
// redis:.cluster/run/redis.pid, database:port:13306) or found from the
// target's loopback URL and the deployment's Redis and MySQL addresses.

// procSpec is one process to measure before it is found: a label and a
// pid, a pid file, or port:N.
type procSpec struct{ label, spec string }

// parseProcSpecs reads "label:spec,label:spec". A spec is a pid, a pid
// file whose first field is the pid (scripts/cluster-up.sh writes "pid
// program"), or port:N, the process(es) listening on loopback port N.
func parseProcSpecs(s string) ([]procSpec, error) {
	var out []procSpec
	for part := range strings.SplitSeq(s, ",") {
		label, spec, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok || label == "" || spec == "" {
			return nil, fmt.Errorf("want label:pid, label:pidfile or label:port:N, got %q", part)
		}
		if slices.ContainsFunc(out, func(p procSpec) bool { return p.label == label }) {
			return nil, fmt.Errorf("label %q given twice", label)
		}
		out = append(out, procSpec{label, spec})
	}
	return out, nil
}

// cpuProc is one measured process: a label and the pids counted as one
// (a server that forks its workers shares its listening socket with them).
type cpuProc struct {
	Label  string `json:"label"`
	Source string `json:"source"` // the pid, pid file or port:N it was found by
	PIDs   []int  `json:"pids"`
}

// resolve finds the process(es) of a spec.
func (p procSpec) resolve() (cpuProc, error) {
	out := cpuProc{Label: p.label, Source: p.spec}
	if port, ok := strings.CutPrefix(p.spec, "port:"); ok {
		n, err := strconv.Atoi(port)
		if err != nil || n <= 0 || n > 65535 {
			return out, fmt.Errorf("%s: %q is not a port", p.label, port)
		}
		if out.PIDs, err = proc.Listeners(n); err != nil {
			return out, err
		}
		if len(out.PIDs) == 0 {
			return out, fmt.Errorf("%s: no process of this user listens on loopback port %d", p.label, n)
		}
		return out, nil
	}
	text := p.spec
	if _, err := strconv.Atoi(p.spec); err != nil {
		b, err := os.ReadFile(p.spec)
		if err != nil {
			return out, fmt.Errorf("%s: %w", p.label, err)
		}
		text = string(b)
	}
	f := strings.Fields(text)
	if len(f) == 0 {
		return out, fmt.Errorf("%s: %s names no pid", p.label, p.spec)
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return out, fmt.Errorf("%s: %s: %w", p.label, p.spec, err)
	}
	if _, err := proc.Ticks(pid); err != nil {
		return out, fmt.Errorf("%s: pid %d: %w", p.label, pid, err)
	}
	out.PIDs = []int{pid}
	return out, nil
}

// ticks is the CPU time the process's pids have used so far.
func (p cpuProc) ticks() (uint64, error) {
	var sum uint64
	for _, pid := range p.PIDs {
		n, err := proc.Ticks(pid)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", p.Label, err)
		}
		sum += n
	}
	return sum, nil
}

func (p cpuProc) pidList() string {
	s := make([]string, len(p.PIDs))
	for i, pid := range p.PIDs {
		s[i] = strconv.Itoa(pid)
	}
	return strings.Join(s, "+")
}

// cpuSample is every measured process's ticks at one moment.
type cpuSample []uint64

func sampleCPU(procs []cpuProc) (cpuSample, error) {
	out := make(cpuSample, len(procs))
	for i, p := range procs {
		n, err := p.ticks()
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

// perUnit is each process's CPU between two samples in microseconds per
// unit (answer, order written), hz ticks a second. A count that went back
// means the pid now names another process.
func perUnit(before, after cpuSample, hz int64, units int) ([]float64, error) {
	if len(before) != len(after) || hz <= 0 || units <= 0 {
		return nil, fmt.Errorf("cpu: %d and %d samples, %d ticks/s, %d units", len(before), len(after), hz, units)
	}
	out := make([]float64, len(before))
	for i := range before {
		if after[i] < before[i] {
			return nil, errors.New("cpu: a process's time went back: it was restarted")
		}
		out[i] = float64(after[i]-before[i]) * 1e6 / float64(hz) / float64(units)
	}
	return out, nil
}

// deployment is where a target's Redis and database listen, to find their
// processes when they are on loopback.
type deployment struct {
	redis, locks, mysql string // a Redis URL, SECKILL_LOCK_NODES (URLs, comma-separated), a MySQL DSN
}

// autoSpecs are the processes found without --pids: the server of a
// loopback target URL (service), the Redis servers of the deployment's
// loopback addresses (redis, locks; label@port when there are several) and
// its database (database).
func autoSpecs(target string, d deployment) []procSpec {
	var out []procSpec
	seen := map[int]bool{}
	add := func(label string, port int) {
		if port > 0 && !seen[port] {
			seen[port] = true
			out = append(out, procSpec{label, "port:" + strconv.Itoa(port)})
		}
	}
	if u, err := url.Parse(target); err == nil {
		add("service", loopbackPort(u.Host, u.Scheme))
	}
	redisGroup := func(label string, urls []string) {
		var ports []int
		for _, raw := range urls {
			for _, addr := range redisAddrs(raw) {
				if p := loopbackPort(addr, ""); p > 0 && !seen[p] && !slices.Contains(ports, p) {
					ports = append(ports, p)
				}
			}
		}
		for _, p := range ports {
			name := label
			if len(ports) > 1 {
				name = fmt.Sprintf("%s@%d", label, p)
			}
			add(name, p)
		}
	}
	redisGroup("redis", []string{d.redis})
	redisGroup("locks", strings.Split(d.locks, ","))
	// Of a DSN listing several hosts, the first: the primary of a local
	// cluster until a failover.
	if cfg, err := db.ParseDSN(d.mysql); err == nil && d.mysql != "" && cfg.Net == "tcp" {
		first, _, _ := strings.Cut(cfg.Addr, ",")
		add("database", loopbackPort(first, ""))
	}
	return out
}

// redisAddrs lists the host:port of a Redis URL: its host, and every
// addr= of a redis-cluster:// URL.
func redisAddrs(raw string) []string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Host == "" {
		return nil
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "6379")
	}
	return append([]string{host}, u.Query()["addr"]...)
}

// loopbackPort is the port of a loopback host:port (scheme's default port
// when none is given), 0 for another host.
func loopbackPort(hostport, scheme string) int {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, map[string]string{"http": "80", "https": "443"}[scheme]
	}
	ip := net.ParseIP(host)
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return 0
	}
	n, _ := strconv.Atoi(port)
	return n
}

// mergeSpecs is auto with given's entries in place of auto's of the same
// label and the rest of given after them; a given spec "none" drops its
// label.
func mergeSpecs(auto, given []procSpec) []procSpec {
	out := slices.Clone(auto)
	for _, g := range given {
		if i := slices.IndexFunc(out, func(p procSpec) bool { return p.label == g.label }); i >= 0 {
			out[i] = g
		} else {
			out = append(out, g)
		}
	}
	return slices.DeleteFunc(out, func(p procSpec) bool { return p.spec == "none" })
}

// resolveAll finds the processes of specs. Those the user gave (explicit)
// must be found; those found from the deployment's addresses that are not
// are noted on log and left out.
func resolveAll(specs []procSpec, explicit []procSpec, log io.Writer, what string) ([]cpuProc, error) {
	var out []cpuProc
	for _, s := range specs {
		p, err := s.resolve()
		switch {
		case err != nil && slices.Contains(explicit, s):
			return nil, fmt.Errorf("%s: %w", what, err)
		case err != nil:
			fmt.Fprintf(log, "%s: %v: its CPU is not measured\n", what, err)
		default:
			out = append(out, p)
		}
	}
	return out, nil
}

// pidsFlag collects repeated --pids target=label:spec,... for bench.
type pidsFlag map[string][]procSpec

func (f pidsFlag) String() string { return fmt.Sprint(map[string][]procSpec(f)) }
func (f pidsFlag) Set(s string) error {
	name, specs, ok := strings.Cut(s, "=")
	if !ok || name == "" || specs == "" {
		return fmt.Errorf("want target=label:spec,..., or target=none, got %q", s)
	}
	if _, dup := f[name]; dup {
		return fmt.Errorf("--pids %s given twice", name)
	}
	if specs == "none" {
		f[name] = nil
		return nil
	}
	p, err := parseProcSpecs(specs)
	if err != nil {
		return err
	}
	f[name] = p
	return nil
}

// cpuBase says which target each process's CPU is compared with: "bare"
// (every process), or "bare,redis=ceiling" (redis against the ceiling's
// redis, every other process against bare's).
type cpuBase struct {
	all     string
	byLabel map[string]string
}

func parseCPUBase(s string) (cpuBase, error) {
	b := cpuBase{byLabel: map[string]string{}}
	for part := range strings.SplitSeq(s, ",") {
		label, target, ok := strings.Cut(part, "=")
		switch {
		case part == "":
		case !ok && b.all == "":
			b.all = part
		case !ok:
			return b, fmt.Errorf("--cpu-base: two default targets, %q and %q", b.all, part)
		case label == "" || target == "":
			return b, fmt.Errorf("--cpu-base: want target or label=target, got %q", part)
		default:
			b.byLabel[label] = target
		}
	}
	return b, nil
}

// of is the base target of a label: its own, else the default, else bare
// when there is such a target, else the first.
func (b cpuBase) of(label string, targets []target) string {
	if t, ok := b.byLabel[label]; ok {
		return t
	}
	if b.all != "" {
		return b.all
	}
	if slices.ContainsFunc(targets, func(t target) bool { return t.name == "bare" }) {
		return "bare"
	}
	return targets[0].name
}

// cpuFigure is one process's CPU per answer over a target's runs in one
// mode; Label "total" sums the target's processes.
type cpuFigure struct {
	cpuProc
	Runs   []float64 `json:"us_per_answer_runs"`
	Median float64   `json:"median_us_per_answer"`
	Base   string    `json:"base_target,omitempty"` // the target compared with
	Ratio  float64   `json:"ratio_to_base,omitempty"`
}

// addCPURun appends one run's figures, and their sum to the total row
// (the last), creating the rows on the first run; no processes, no rows.
func addCPURun(figs []cpuFigure, procs []cpuProc, us []float64) []cpuFigure {
	if len(procs) == 0 {
		return figs
	}
	if len(figs) == 0 {
		for _, p := range procs {
			figs = append(figs, cpuFigure{cpuProc: p})
		}
		figs = append(figs, cpuFigure{cpuProc: cpuProc{Label: "total"}})
	}
	var sum float64
	for i, v := range us {
		figs[i].Runs = append(figs[i].Runs, v)
		sum += v
	}
	figs[len(figs)-1].Runs = append(figs[len(figs)-1].Runs, sum)
	return figs
}

// median of xs (the upper middle one for an even count), sorting a copy.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}

// compareCPU fills each mode's medians and ratios to the base targets.
func compareCPU(mode []benchResult, base cpuBase, targets []target) {
	for i := range mode {
		for j := range mode[i].CPU {
			mode[i].CPU[j].Median = median(mode[i].CPU[j].Runs)
		}
		mode[i].Loadgen = median(mode[i].LoadgenRuns)
	}
	for i := range mode {
		for j := range mode[i].CPU {
			f := &mode[i].CPU[j]
			f.Base = base.of(f.Label, targets)
			k := slices.IndexFunc(mode, func(b benchResult) bool { return b.Name == f.Base })
			if k < 0 {
				f.Base = ""
				continue
			}
			if l := slices.IndexFunc(mode[k].CPU, func(g cpuFigure) bool { return g.Label == f.Label }); l >= 0 && mode[k].CPU[l].Median > 0 {
				f.Ratio = f.Median / mode[k].CPU[l].Median
			}
		}
	}
}

// printCPU writes a mode's CPU table.
func printCPU(w io.Writer, mode []benchResult) {
	if !slices.ContainsFunc(mode, func(b benchResult) bool { return len(b.CPU) > 0 || len(b.LoadgenRuns) > 0 }) {
		return
	}
	fmt.Fprintf(w, "CPU µs per answer (utime+stime of /proc/<pid>/stat over each measured run / its answers), median, ratio to the same process of the base target:\n")
	fmt.Fprintf(w, "%-10s %-14s %-16s %-30s %8s %8s %s\n", "target", "process", "pids", "runs", "median", "ratio", "base")
	row := func(target, label, pids string, runs []float64, med float64, ratio, base string) {
		r := make([]string, len(runs))
		for i, v := range runs {
			r[i] = fmt.Sprintf("%.1f", v)
		}
		fmt.Fprintf(w, "%-10s %-14s %-16s %-30s %8.1f %8s %s\n", target, label, pids, strings.Join(r, " "), med, ratio, base)
	}
	for _, b := range mode {
		for _, f := range b.CPU {
			ratio := "-"
			if f.Ratio > 0 {
				ratio = fmt.Sprintf("%.2fx", f.Ratio)
			}
			row(b.Name, f.Label, cmp.Or(f.pidList(), "-"), f.Runs, f.Median, ratio, f.Base)
		}
		if len(b.LoadgenRuns) > 0 {
			row(b.Name, "(load gen)", strconv.Itoa(os.Getpid()), b.LoadgenRuns, b.Loadgen, "-", "not in the total")
		}
	}
}

// cpuMeter measures one target's processes around each of its runs, and
// the load generator itself (this process), which shares the cores.
type cpuMeter struct {
	hz    int64 // clock ticks a second
	procs []cpuProc
}

// cpuRun is one run's two samples: the target's processes, then this one.
type cpuRun struct {
	m             *cpuMeter
	before, after cpuSample
	err           error
}

// sample reads the target's processes and this process.
func (m *cpuMeter) sample() (cpuSample, error) {
	return sampleCPU(append(slices.Clip(m.procs), cpuProc{Label: "load generator", PIDs: []int{os.Getpid()}}))
}

// around has cfg's run sample the processes just before its measured
// purchases and just after.
func (m *cpuMeter) around(cfg *load.Config) *cpuRun {
	r := &cpuRun{m: m}
	cfg.Measure = func() { r.before, r.err = m.sample() }
	cfg.Fired = func() {
		if r.err == nil {
			r.after, r.err = m.sample()
		}
	}
	return r
}

// perUnit is the run's CPU per unit for each of the target's processes,
// and for the load generator.
func (r *cpuRun) perUnit(units int) (procs []float64, loadgen float64, err error) {
	switch {
	case r.err != nil:
		return nil, 0, r.err
	case r.before == nil || r.after == nil:
		return nil, 0, errors.New("cpu: the measured run was not sampled")
	}
	us, err := perUnit(r.before, r.after, r.m.hz, units)
	if err != nil {
		return nil, 0, err
	}
	return us[:len(us)-1], us[len(us)-1], nil
}

// benchMeters finds each target's processes: those --pids gives, else
// autoSpecs's, and says on log what will be measured.
func benchMeters(targets []target, pids pidsFlag, dep deployment, log io.Writer) ([]*cpuMeter, error) {
	for name := range pids {
		if !slices.ContainsFunc(targets, func(t target) bool { return t.name == name }) {
			return nil, fmt.Errorf("--pids %s: no such --target", name)
		}
	}
	hz, err := proc.ClockTick()
	if err != nil {
		return nil, err
	}
	meters := make([]*cpuMeter, len(targets))
	for i, t := range targets {
		given, ok := pids[t.name]
		specs := mergeSpecs(autoSpecs(t.url, dep), given)
		if ok && given == nil { // target=none
			specs = nil
		}
		procs, err := resolveAll(specs, given, log, t.name)
		if err != nil {
			return nil, err
		}
		meters[i] = &cpuMeter{hz: hz, procs: procs}
		fmt.Fprintf(log, "%s: CPU measured of %s\n", t.name, describeProcs(procs))
	}
	return meters, nil
}

// describeProcs is "service (pid 12, port:18088), redis (...)".
func describeProcs(procs []cpuProc) string {
	if len(procs) == 0 {
		return "no process"
	}
	parts := make([]string, len(procs))
	for i, p := range procs {
		parts[i] = fmt.Sprintf("%s (pid %s, %s)", p.Label, p.pidList(), p.Source)
	}
	return strings.Join(parts, ", ")
}

// drainCPU is one process's CPU per order a drain wrote.
type drainCPU struct {
	cpuProc
	// SinceStart: it was not running when the watch began (a worker
	// started after it), so its whole life is counted, start-up included.
	SinceStart bool    `json:"counted_from_its_start,omitempty"`
	PerOrder   float64 `json:"us_per_order"`
}

// drainMeter measures processes from the start of a drain's watch to its
// end. A process not found at the start (the worker, started once the
// watch runs) is looked for again at the end and counted from its start.
type drainMeter struct {
	specs, explicit []procSpec
	log             io.Writer

	hz     int64
	procs  []cpuProc
	late   []procSpec
	before cpuSample
	err    error
}

// start samples what can be found now (load.DrainConfig.Watching).
func (m *drainMeter) start() {
	if m.hz, m.err = proc.ClockTick(); m.err != nil {
		return
	}
	for _, s := range m.specs {
		if p, err := s.resolve(); err == nil {
			m.procs = append(m.procs, p)
		} else {
			m.late = append(m.late, s)
		}
	}
	m.before, m.err = sampleCPU(m.procs)
}

// startedLate adds a process started once the watch began (a worker its
// caller starts from Watching, after start): it is looked for at the end,
// must be found, and is counted from its start.
func (m *drainMeter) startedLate(s procSpec) {
	m.late = append(m.late, s)
	m.explicit = append(m.explicit, s)
}

// finish samples again and divides by the orders written; the last row is
// the total.
func (m *drainMeter) finish(orders int) ([]drainCPU, error) {
	if m.err != nil || len(m.specs)+len(m.late) == 0 {
		return nil, m.err
	}
	after, err := sampleCPU(m.procs)
	if err != nil {
		return nil, err
	}
	procs, before := slices.Clone(m.procs), slices.Clone(m.before)
	late, err := resolveAll(m.late, m.explicit, m.log, "drain")
	if err != nil {
		return nil, err
	}
	for _, p := range late {
		n, err := p.ticks()
		if err != nil {
			return nil, err
		}
		procs, before, after = append(procs, p), append(before, 0), append(after, n)
	}
	if len(procs) == 0 {
		return nil, nil
	}
	us, err := perUnit(before, after, m.hz, orders)
	if err != nil {
		return nil, err
	}
	out := make([]drainCPU, 0, len(procs)+1)
	var sum float64
	for i, p := range procs {
		out = append(out, drainCPU{cpuProc: p, SinceStart: i >= len(m.procs), PerOrder: us[i]})
		sum += us[i]
	}
	return append(out, drainCPU{cpuProc: cpuProc{Label: "total"}, PerOrder: sum}), nil
}
