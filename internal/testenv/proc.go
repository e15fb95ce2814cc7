package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// errUnavailable marks "no server of this kind can be had here", which makes
// a test skip (or fail under CI) rather than report a broken server.
var errUnavailable = errors.New("test server unavailable")

// proc is a server process started by this package. It runs in its own process
// group so that our signals also reach what it forks (a Redis AOF rewrite, the
// shell of mariadb-install-db) and so that a terminal's Ctrl-C reaches Main,
// which stops it, instead of killing it behind the test binary's back.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string        // file holding the process's stdout and stderr
	done chan struct{} // closed once the process has exited and been reaped
}

// live holds every running process so that Main and an interrupt can stop the
// ones whose test never reached its cleanup.
var live = struct {
	sync.Mutex
	procs  map[*proc]struct{}
	closed bool // set by stopAll: a process started later would outlive it
}{procs: map[*proc]struct{}{}}

// startProc starts bin in dir, appending its output to logPath: appending
// keeps the log of a run before a restart, which is often the interesting one.
func startProc(dir, logPath, bin string, args ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer f.Close() // the child holds its own descriptor once started
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &proc{name: bin, cmd: cmd, log: logPath, done: make(chan struct{})}
	live.Lock()
	live.procs[p] = struct{}{}
	closed := live.closed
	live.Unlock()
	go func() {
		_ = cmd.Wait()
		live.Lock()
		delete(live.procs, p)
		live.Unlock()
		close(p.done)
	}()
	if closed {
		_ = p.stop(syscall.SIGKILL, time.Second)
		return nil, fmt.Errorf("start %s: testenv is shutting down", bin)
	}
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process group. It does nothing once the process has
// been reaped, since its pid may then belong to someone else.
func (p *proc) signal(sig syscall.Signal) error {
	if p.exited() {
		return nil
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %v to %s (pid %d): %w", sig, p.name, p.cmd.Process.Pid, err)
	}
	return nil
}

// stop sends sig and waits up to grace for the exit, then escalates to
// SIGKILL. It also sends SIGCONT: a paused process acts on SIGTERM only once
// it runs again.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) error {
	if err := p.signal(sig); err != nil {
		return err
	}
	_ = p.signal(syscall.SIGCONT)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.signal(syscall.SIGKILL)
	select {
	case <-p.done:
		return fmt.Errorf("%s (pid %d) ignored %v for %s and was killed", p.name, p.cmd.Process.Pid, sig, grace)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) still running after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// waitReady polls probe until it succeeds, the process exits or timeout
// passes. Failures carry the tail of the log, which says why far better than
// the probe's error.
func (p *proc) waitReady(timeout time.Duration, probe func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := probe(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %w\nlog tail:\n%s", p.name, timeout, err, tail(p.log))
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%v)\nlog tail:\n%s", p.name, p.cmd.ProcessState, tail(p.log))
		case <-tick.C:
		}
	}
}

// tail returns the end of a log file, enough to show a startup error.
func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	const n = 4096
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// freePort returns a loopback port that was free a moment ago. Servers are
// separate processes, so we cannot hand them a listener; the race is accepted.
func freePort() (int, error) {
	givenMu.Lock()
	defer givenMu.Unlock()
	// The kernel may hand the port it just freed out again: a test that
	// asks for two (an API and an admin listener) would get one twice.
	// A port is given once per test process.
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !given[p] {
			given[p] = true
			return p, nil
		}
	}
	return 0, fmt.Errorf("find free port: every port offered was given before")
}

var (
	givenMu sync.Mutex
	given   = map[int]bool{}
)

// lookBin finds a server binary. Debian installs daemons in /usr/sbin, which
// is often missing from PATH.
func lookBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if p, err := exec.LookPath("/usr/sbin/" + name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%w: %s not found in PATH or /usr/sbin", errUnavailable, name)
}

// server is a process a test may crash, pause and restart on purpose; its
// methods are shared by RedisServer and MariaDB, which embed it.
type server struct {
	name string                // "redis" or "mariadb", for messages
	run  func() (*proc, error) // starts the process and waits until it is ready

	mu     sync.Mutex
	proc   *proc
	paused bool // stopped by Pause, not yet resumed
}

// Kill sends SIGKILL and waits for the exit: a crash, with no chance to flush.
func (s *server) Kill(tb testing.TB) { tb.Helper(); s.stop(tb, syscall.SIGKILL) }

// Stop sends SIGTERM and waits for the exit: an orderly shutdown.
func (s *server) Stop(tb testing.TB) { tb.Helper(); s.stop(tb, syscall.SIGTERM) }

// Pause sends SIGSTOP: the server keeps its connections but answers nothing,
// like a long GC pause or a network partition.
func (s *server) Pause(tb testing.TB) { tb.Helper(); s.signal(tb, syscall.SIGSTOP) }

// Resume sends SIGCONT, undoing Pause.
func (s *server) Resume(tb testing.TB) { tb.Helper(); s.signal(tb, syscall.SIGCONT) }

// Restart stops the server if it still runs, then starts it again on the same
// port and directory, so clients reconnect to the same address and find what
// was persisted: Redis replays its AOF, InnoDB recovers from its redo log.
func (s *server) Restart(tb testing.TB) {
	tb.Helper()
	s.Stop(tb)
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.run()
	if err != nil {
		tb.Fatalf("restart %s: %v", s.name, err)
	}
	s.proc = p
	s.paused = false
}

func (s *server) stop(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.proc.stop(sig, 30*time.Second); err != nil {
		tb.Errorf("stop %s: %v", s.name, err)
	}
	s.paused = false // stop sends SIGCONT
}

func (s *server) signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.proc.signal(sig); err != nil {
		tb.Fatal(err)
	}
	switch sig {
	case syscall.SIGSTOP:
		s.paused = true
	case syscall.SIGCONT:
		s.paused = false
	}
}

// live reports whether the server runs and is not paused: whether it can
// answer.
func (s *server) live() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.paused && !s.proc.exited()
}

// close kills the server: its data is thrown away, so there is nothing to
// shut down gracefully.
func (s *server) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.proc.stop(syscall.SIGKILL, 5*time.Second)
}
