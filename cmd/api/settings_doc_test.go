package main

import (
	"flag"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var (
	settingName = regexp.MustCompile(`^SECKILL_[A-Z0-9_]+$`)
	tableRow    = regexp.MustCompile("^\\| `([^`]+)` \\| ([^|]+?) \\| (.+) \\|$")
	backticked  = regexp.MustCompile("^`([^`]*)`")
)

// settingsDoc is the guide that holds the settings table, from cmd/api.
const settingsDoc = "../../docs/operating.md"

// docSettings reads the settings table of docs/operating.md (its Settings
// section): setting or flag -> its default cell.
func docSettings(t testing.TB) map[string]string {
	t.Helper()
	b, err := os.ReadFile(settingsDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Settings\n")
	if !ok {
		t.Fatal("docs/operating.md has no Settings section")
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	rows := map[string]string{}
	for line := range strings.Lines(section) {
		m := tableRow.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		if _, dup := rows[m[1]]; dup {
			t.Errorf("docs/operating.md lists %s twice", m[1])
		}
		if strings.TrimSpace(m[3]) == "" {
			t.Errorf("docs/operating.md: %s has no meaning", m[1])
		}
		rows[m[1]] = m[2]
	}
	if len(rows) == 0 {
		t.Fatal("no rows found in the settings table of docs/operating.md")
	}
	return rows
}

// codeSettings reads the service's code (the non-test Go files of cmd/api):
// every SECKILL_* name it spells.
func codeSettings(t testing.TB) (env []string) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := gotoken.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == gotoken.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil && settingName.MatchString(s) && !slices.Contains(env, s) {
					env = append(env, s)
				}
			}
			return true
		})
	}
	return env
}

// commandFlags is every flag of the commands table, as "api <command>
// --<flag>", with its default as the documented table writes it: `50`,
// (required) for a flag the command needs, (none) for an empty default.
func commandFlags() map[string]string {
	out := map[string]string{}
	for _, c := range commands {
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.flags(fs)
		fs.VisitAll(func(f *flag.Flag) {
			cell := "`" + f.DefValue + "`"
			switch {
			case isRequired(f):
				cell = "(required)"
			case f.DefValue == "":
				cell = "(none)" // as the settings without a default
			}
			out["api "+c.name+" --"+f.Name] = cell
		})
	}
	return out
}

// TestSettingsDoc: the settings table of docs/operating.md has a row for
// each row of the code's settings table (settings()) and each flag of its
// commands table, and nothing else, each with the code's default as the table
// writes it; every SECKILL_* name the code spells is a row of the table
// (nothing reads the environment around it); and every default in
// backticks is the one loading takes: setting it explicitly changes
// nothing, except that a listen address given by name must bind
// (AddrGiven, AdminAddrGiven).
func TestSettingsDoc(t *testing.T) {
	t.Parallel()
	rows := docSettings(t)
	table := map[string]string{}
	for _, s := range settings() {
		if _, dup := table[s.name]; dup {
			t.Errorf("the settings table has %s twice", s.name)
		}
		table[s.name] = s.defaultCell()
	}
	for name, cell := range commandFlags() {
		table[name] = cell
	}
	if len(table) < 40 {
		t.Fatalf("the settings table has only %d rows: is it read?", len(table))
	}
	for name, def := range table {
		cell, ok := rows[name]
		switch {
		case !ok:
			t.Errorf("docs/operating.md's settings table lacks %s (default %s)", name, def)
		case strings.TrimSpace(cell) != def:
			t.Errorf("docs/operating.md: %s defaults to %s, the code's table to %s", name, strings.TrimSpace(cell), def)
		}
	}
	for name := range rows {
		if _, ok := table[name]; !ok {
			t.Errorf("docs/operating.md lists %s, which the code's tables do not have", name)
		}
	}
	for _, name := range codeSettings(t) {
		if _, ok := table[name]; !ok {
			t.Errorf("the code spells %s, which is not a row of the settings table", name)
		}
	}

	base, err := loadConfig(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range settings() {
		m := backticked.FindStringSubmatch(rows[s.name])
		if m == nil {
			continue // "(embedded)", "(none)": no value to compare
		}
		got, err := loadConfig(func(k string) string {
			if k == s.name {
				return m[1]
			}
			return ""
		})
		if err != nil {
			t.Errorf("docs/operating.md's default of %s, %q, is refused: %v", s.name, m[1], err)
			continue
		}
		got.AddrGiven, got.AdminAddrGiven = false, false
		if !reflect.DeepEqual(got, base) {
			t.Errorf("docs/operating.md: %s=%q is not the default: setting it changes the configuration", s.name, m[1])
		}
	}
}
