package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxCyclo is the most branches a function of the load tool may have, as
// the service's code (issue #33): `go run
// github.com/fzipp/gocyclo/cmd/gocyclo@v0.6.0 -over 15 -ignore _test loadtest/`
// prints nothing.
const maxCyclo = 15

// TestCommandsReadLikeTheService: no function of the load tool (its
// commands, load/, proc/, ceiling/; tests aside) is above cyclomatic
// complexity 15, counted as gocyclo v0.6.0 counts it (cyclo), so that the
// check runs offline and adds nothing to go.mod.
func TestCommandsReadLikeTheService(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for name, fn := range funcsOf(f) {
			if n := cyclo(fn); n > maxCyclo {
				t.Errorf("%s: %s has cyclomatic complexity %d, above %d: split it into named steps", fset.Position(fn.Pos()), name, n, maxCyclo)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCycloCountsAsGocyclo: each branch gocyclo counts adds one (if, for,
// range, a case or select case other than default, && and ||, function
// literals inside included); else, default and plain statements add none.
func TestCycloCountsAsGocyclo(t *testing.T) {
	t.Parallel()
	src := `package p
func none() { x := 1; _ = x }
func all(a, b bool, xs []int, c chan int) {
	if a && b || a { } else { }
	for i := 0; i < 1; i++ { }
	for range xs { }
	switch { case a: case b, a: default: }
	select { case <-c: default: }
	f := func() { if b { } }
	_ = f
}
var lit = func(a bool) { if a { } }
`
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	// all: 1, if 1 + && 1 + || 1, for 1, range 1, two cases 2, select case 1, the literal's if 1.
	want := map[string]int{"none": 1, "all": 10, "lit": 2}
	got := map[string]int{}
	for name, fn := range funcsOf(f) {
		got[name] = cyclo(fn)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %d, want %d", name, got[name], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("functions %v, want %v", got, want)
	}
}

// funcsOf yields a file's functions as gocyclo finds them: every function
// and method declared, and function literals assigned at package level.
func funcsOf(f *ast.File) func(yield func(string, ast.Node) bool) {
	return func(yield func(string, ast.Node) bool) {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !yield(d.Name.Name, d) {
					return
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					vs, ok := spec.(*ast.ValueSpec)
					if !ok {
						continue
					}
					for _, v := range vs.Values {
						if lit, ok := v.(*ast.FuncLit); ok && !yield(vs.Names[0].Name, lit) {
							return
						}
					}
				}
			}
		}
	}
}

// cyclo is gocyclo's cyclomatic complexity of a function: 1 plus one per
// if, for, range, non-default case and select case, && and ||.
func cyclo(fn ast.Node) int {
	n := 1
	ast.Inspect(fn, func(node ast.Node) bool {
		switch x := node.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			n++
		case *ast.CaseClause:
			if x.List != nil {
				n++
			}
		case *ast.CommClause:
			if x.Comm != nil {
				n++
			}
		case *ast.BinaryExpr:
			if x.Op == token.LAND || x.Op == token.LOR {
				n++
			}
		}
		return true
	})
	return n
}
