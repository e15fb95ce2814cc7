package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestK6ScriptsParse checks the k6 scripts' syntax with node (there is no k6
// here) and that they import only k6's built-in modules.
func TestK6ScriptsParse(t *testing.T) {
	t.Parallel()
	scripts, err := filepath.Glob("k6/*.js")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no k6 scripts in loadtest/k6: %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node not found (scripts/deps.sh installs it)")
		}
		t.Skip("node not found; install nodejs to check the k6 scripts")
	}
	imports := regexp.MustCompile(`(?m)^\s*import\s.*?from\s+['"]([^'"]+)['"]`)
	builtin := regexp.MustCompile(`^k6(/[a-z0-9/-]+)?$`)
	for _, s := range scripts {
		src, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range imports.FindAllStringSubmatch(string(src), -1) {
			if !builtin.MatchString(m[1]) {
				t.Errorf("%s imports %q: only k6's built-in modules, no remote or local ones", s, m[1])
			}
		}
		// k6 scripts are ES modules; node reads .mjs files as such.
		mjs := filepath.Join(t.TempDir(), filepath.Base(s)+".mjs")
		if err := os.WriteFile(mjs, src, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(node, "--check", mjs).CombinedOutput(); err != nil {
			t.Errorf("node --check %s: %v\n%s", s, err, out)
		}
	}
}
