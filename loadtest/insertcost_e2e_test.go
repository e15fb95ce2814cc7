//go:build linux

package main

import (
	"os"
	"os/exec"
	"regexp"
	"testing"

	"seckill/internal/testenv"
)

// TestInsertCostRuns: insertcost.sh starts its MariaDB, applies the
// schema, writes into every copy of orders and prints a median for each,
// then stops its server. A column the worker's row shape lacks, or a
// migration the client cannot run, fails it here rather than on the day
// of a measurement.
func TestInsertCostRuns(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"mariadbd", "mariadb-install-db", "mariadb"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s: insertcost.sh not run", bin)
		}
	}
	dir := t.TempDir()
	cmd := exec.Command("./insertcost.sh")
	cmd.Env = append(os.Environ(), "INSERTCOST_DIR="+dir, "INSERTCOST_PORT="+testenv.FreePort(t),
		"INSERTCOST_ORDERS=1000", "INSERTCOST_ROUNDS=1")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("insertcost.sh: %v\n%s", err, b)
	}
	for _, c := range []string{"full", "nofk", "nodue", "nounitback", "nocode", "nobuyer", "pkonly"} {
		if !regexp.MustCompile(`(?m)^  ` + c + ` +[0-9]+\.[0-9] +\([0-9.]+\)$`).Match(b) {
			t.Fatalf("no median for the copy %s in:\n%s", c, b)
		}
	}
}
