package hotkey

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestExportedNames: the package exports exactly the names
// docs/architecture.md's "What a gateway imports" gives a line each, so
// that a name is added to the API with the reason a gateway needs it, and
// the list stays current.
func TestExportedNames(t *testing.T) {
	got := exportedNames(t, ".")
	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## What a gateway imports\n")
	if !ok {
		t.Fatal(`docs/architecture.md has no section "What a gateway imports"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var listed []string
	for line := range strings.SplitSeq(section, "\n") {
		if rest, ok := strings.CutPrefix(line, "- `"); ok {
			name, _, _ := strings.Cut(rest, "`")
			listed = append(listed, name)
		}
	}
	slices.Sort(listed)
	for i := 1; i < len(listed); i++ {
		if listed[i] == listed[i-1] {
			t.Errorf("%s is listed twice", listed[i])
		}
	}
	var unlisted, gone []string
	for _, n := range got {
		if _, found := slices.BinarySearch(listed, n); !found {
			unlisted = append(unlisted, n)
		}
	}
	for _, n := range listed {
		if _, found := slices.BinarySearch(got, n); !found {
			gone = append(gone, n)
		}
	}
	t.Logf("%d exported names, %d listed", len(got), len(listed))
	if len(unlisted) > 0 {
		t.Errorf("%d of %d exported names have no line in docs/architecture.md: %v", len(unlisted), len(got), unlisted)
	}
	if len(gone) > 0 {
		t.Errorf("%d listed names are not exported: %v", len(gone), gone)
	}
}

// exportedNames returns the exported names of the package in dir, but for
// its tests: top-level names, and methods of exported types as
// Type.Method; sorted.
func exportedNames(t *testing.T, dir string) []string {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if !d.Name.IsExported() {
						continue
					}
					if d.Recv == nil {
						names = append(names, d.Name.Name)
						continue
					}
					typ := d.Recv.List[0].Type
					if star, ok := typ.(*ast.StarExpr); ok {
						typ = star.X
					}
					if id, ok := typ.(*ast.Ident); ok && id.IsExported() {
						names = append(names, id.Name+"."+d.Name.Name)
					}
				case *ast.GenDecl:
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.TypeSpec:
							if s.Name.IsExported() {
								names = append(names, s.Name.Name)
							}
						case *ast.ValueSpec:
							for _, n := range s.Names {
								if n.IsExported() {
									names = append(names, n.Name)
								}
							}
						}
					}
				}
			}
		}
	}
	slices.Sort(names)
	return names
}
