package layout

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/onehop/onehop"

// arrows says which of the project's packages a package may import, by
// folder: the longest prefix that matches a package's folder holds its
// rule. A package may always import the packages below its own folder,
// and every package may import the ones listed in its rule and below
// them. test/... and cmd/... import anything.
var arrows = map[string][]string{
	"portal":             {},
	"portal/portalfuzz":  {"portal"},
	"config":             {"portal", "external/config"},
	"dataplane":          {"portal"},
	"nft":                {"dataplane", "portal"},
	"ipvs":               {"dataplane", "portal"},
	"external":           {"portal", "dataplane"},
	"external/providers": {"portal", "dataplane", "external/claims", "external/alloc", "external/config", "external/leases", "external/ipam", "external/bgp", "external/l2", "external/webhook"},
	"external/claims":    {"portal", "dataplane", "external/alloc", "external/config", "external/ipam"},
	"external/alloc":     {"portal", "dataplane", "external/config", "external/metallb", "external/ipam"},
	"external/metallb":   {"portal", "external/config", "external/api", "external/bgp"},
	"external/config":    {"portal", "external/api", "external/bgp", "external/ipam", "external/l2", "external/webhook"},
	"external/leases":    {"portal", "dataplane", "external/heartbeat", "external/l2"},
	"external/internal":  {"portal", "dataplane", "external/claims", "external/config", "external/leases", "external/internal"},
	"external/ipam":      {"portal"},
	"external/bgp":       {},
	"external/l2":        {},
	"external/heartbeat": {},
	"external/webhook":   {},
	"external/api":       {},
	"cmd":                {""},
	"test":               {""},
}

// maxLines is the most lines a file may have: a longer one holds
// several concepts, to be split by concern.
const maxLines = 600

// pkg is what the test reads of one folder's Go files.
type pkg struct {
	dir     string // relative to the repository, slash separated
	hasDoc  bool
	imports map[string][]string // project import path -> files importing it
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil && !strings.HasSuffix(dir, filepath.Join("test", "tools")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test")
		}
		dir = parent
	}
}

// readPackages parses the imports and doc comments of every Go file in
// the module (test/tools, a module of its own, aside).
func readPackages(t *testing.T, root string) (map[string]*pkg, map[string]int) {
	t.Helper()
	pkgs := map[string]*pkg{}
	lines := map[string]int{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "test/tools" || strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || d.Name() == "bin" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(filepath.Base(rel), "zz_generated") && !strings.Contains(string(src), "Code generated") {
			lines[rel] = strings.Count(string(src), "\n")
		}
		if strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, src, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		p := pkgs[dir]
		if p == nil {
			p = &pkg{dir: dir, imports: map[string][]string{}}
			pkgs[dir] = p
		}
		if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
			p.hasDoc = true
		}
		for _, imp := range f.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			if ip == module || strings.HasPrefix(ip, module+"/") {
				p.imports[strings.TrimPrefix(strings.TrimPrefix(ip, module), "/")] = append(p.imports[strings.TrimPrefix(strings.TrimPrefix(ip, module), "/")], filepath.Base(rel))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs, lines
}

// under reports whether folder dir is base or below it.
func under(dir, base string) bool {
	return base == "" || dir == base || strings.HasPrefix(dir, base+"/")
}

// rule returns the arrows of the longest folder prefix of dir.
func rule(dir string) (string, []string, bool) {
	best := ""
	found := false
	for base := range arrows {
		if under(dir, base) && (!found || len(base) > len(best)) {
			best, found = base, true
		}
	}
	return best, arrows[best], found
}

// TestImportArrows fails when a package imports one of the project's
// packages that its folder's rule does not allow: the arrows between the
// rooms run one way (README.md's layout table and external/README.md).
func TestImportArrows(t *testing.T) {
	pkgs, _ := readPackages(t, repoRoot(t))
	if len(pkgs) < 10 {
		t.Fatalf("read only %d packages", len(pkgs))
	}
	for _, dir := range sortedKeys(pkgs) {
		p := pkgs[dir]
		base, allowed, ok := rule(dir)
		if !ok {
			t.Errorf("%s: no import rule for this folder; add it to arrows", dir)
			continue
		}
		for _, imp := range sortedKeys(p.imports) {
			if !under(imp, dir) && !underAny(imp, allowed) {
				t.Errorf("%s imports %s (%s): the rule of %s/ allows only %q and the folder's own subpackages",
					dir, imp, strings.Join(p.imports[imp], ", "), base, allowed)
			}
		}
	}
}

func underAny(dir string, bases []string) bool {
	for _, b := range bases {
		if under(dir, b) {
			return true
		}
	}
	return false
}

// TestEveryPackageSaysWhatItOwns fails when a package has no doc comment.
func TestEveryPackageSaysWhatItOwns(t *testing.T) {
	pkgs, _ := readPackages(t, repoRoot(t))
	for _, dir := range sortedKeys(pkgs) {
		if !pkgs[dir].hasDoc {
			t.Errorf("%s: no package doc comment saying what it owns", dir)
		}
	}
}

// TestNoFileOverMaxLines fails when a hand-written Go file holds more than
// maxLines lines.
func TestNoFileOverMaxLines(t *testing.T) {
	_, lines := readPackages(t, repoRoot(t))
	for _, f := range sortedKeys(lines) {
		if lines[f] > maxLines {
			t.Errorf("%s: %d lines, over %d: split it by concern", f, lines[f], maxLines)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
