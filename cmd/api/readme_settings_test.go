package main

import (
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

// readmeSettings reads the settings table of README.md: setting or flag ->
// its default cell.
func readmeSettings(t testing.TB) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Settings\n")
	if !ok {
		t.Fatal("README.md has no Settings section")
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
			t.Errorf("README.md lists %s twice", m[1])
		}
		if strings.TrimSpace(m[3]) == "" {
			t.Errorf("README.md: %s has no meaning", m[1])
		}
		rows[m[1]] = m[2]
	}
	if len(rows) == 0 {
		t.Fatal("no rows found in README.md's settings table")
	}
	return rows
}

// codeSettings reads the service's code (the non-test Go files of cmd/api):
// every SECKILL_* name it spells, and every subcommand flag as
// "api <command> --<flag>" with its default when that is a literal.
func codeSettings(t testing.TB) (env []string, flags map[string]string) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := gotoken.NewFileSet()
	flags = map[string]string{}
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
			if fn, ok := n.(*ast.FuncDecl); ok {
				for k, v := range flagsOf(fn) {
					flags[k] = v
				}
			}
			return true
		})
	}
	return env, flags
}

// flagsOf finds the flag sets a function makes (fs := flag.NewFlagSet("dlq
// list", ...)) and the flags defined on them (fs.Int("limit", 50, ...)).
func flagsOf(fn *ast.FuncDecl) map[string]string {
	sets := map[string]string{} // variable -> command
	out := map[string]string{}
	ast.Inspect(fn, func(n ast.Node) bool {
		if as, ok := n.(*ast.AssignStmt); ok && len(as.Lhs) == 1 && len(as.Rhs) == 1 {
			if call, ok := as.Rhs[0].(*ast.CallExpr); ok && isSel(call.Fun, "flag", "NewFlagSet") && len(call.Args) > 0 {
				if id, ok := as.Lhs[0].(*ast.Ident); ok {
					sets[id.Name] = literal(call.Args[0])
				}
			}
		}
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 3 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		recv, ok := sel.X.(*ast.Ident)
		if !ok || sets[recv.Name] == "" {
			return true
		}
		out["api "+sets[recv.Name]+" --"+literal(call.Args[0])] = literal(call.Args[1])
		return true
	})
	return out
}

func isSel(e ast.Expr, pkg, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != name {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg
}

// literal is the value of a literal expression, "" for anything else.
func literal(e ast.Expr) string {
	switch v := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(v.Value); err == nil {
			return s
		}
		return v.Value
	case *ast.Ident:
		if v.Name == "true" || v.Name == "false" {
			return v.Name
		}
	}
	return ""
}

// TestReadmeSettings: README.md's settings table lists every setting and
// flag the code reads and nothing else, and every default written in
// backticks is the code's: setting it explicitly changes nothing, except
// that a listen address given by name must bind (AddrGiven,
// AdminAddrGiven).
func TestReadmeSettings(t *testing.T) {
	t.Parallel()
	rows := readmeSettings(t)
	env, flags := codeSettings(t)
	if len(env) < 10 || len(flags) == 0 {
		t.Fatalf("found only %d settings and %d flags in the code: is the scan broken?", len(env), len(flags))
	}
	for _, name := range env {
		if _, ok := rows[name]; !ok {
			t.Errorf("README.md's settings table lacks %s, which the code reads", name)
		}
	}
	for name := range flags {
		if _, ok := rows[name]; !ok {
			t.Errorf("README.md's settings table lacks the flag %q", name)
		}
	}
	for name := range rows {
		if _, isFlag := flags[name]; !isFlag && !slices.Contains(env, name) {
			t.Errorf("README.md lists %s, which the code does not read", name)
		}
	}

	base, err := loadConfig(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	for name, cell := range rows {
		m := backticked.FindStringSubmatch(cell)
		if m == nil {
			continue // "(embedded)", "(none)": no value to compare
		}
		def := m[1]
		if code, isFlag := flags[name]; isFlag {
			if code != "" && code != def {
				t.Errorf("README.md: %s defaults to %q, the code to %q", name, def, code)
			}
			continue
		}
		got, err := loadConfig(func(k string) string {
			if k == name {
				return def
			}
			return ""
		})
		if err != nil {
			t.Errorf("README.md's default of %s, %q, is refused: %v", name, def, err)
			continue
		}
		got.AddrGiven, got.AdminAddrGiven = false, false
		if !reflect.DeepEqual(got, base) {
			t.Errorf("README.md: %s=%q is not the default: setting it changes the configuration", name, def)
		}
	}
}
