package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

// built is a program Binary built, or the error that stopped it.
type built struct {
	once sync.Once
	path string
	err  error
}

// binaries are the programs the test binary built, by import path. Package
// state like shared: a build outlives the test that asked for it first.
var binaries struct {
	sync.Mutex
	m map[string]*built
}

// Binary builds the main package pkg ("seckill/cmd/api") once per test
// binary, without the race detector, and returns the executable's path;
// Main removes it at the end. Tests that run the program as its users do
// (a process of its own, its files in its working directory) use it; the
// others call run() in process.
func Binary(tb testing.TB, pkg string) string {
	tb.Helper()
	binaries.Lock()
	if binaries.m == nil {
		binaries.m = map[string]*built{}
	}
	b := binaries.m[pkg]
	if b == nil {
		b = &built{}
		binaries.m[pkg] = b
	}
	binaries.Unlock()
	b.once.Do(func() { b.path, b.err = build(pkg) })
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.path
}

func build(pkg string) (string, error) {
	dir, err := os.MkdirTemp("", "seckill-bin-")
	if err != nil {
		return "", err
	}
	atStop(func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, path.Base(pkg))
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}
