package v1alpha1_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// The deep copies and the CRD manifests are what controller-gen makes of
// the types now: a type changed without `make generate` fails here.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	gen := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command("go", append([]string{"tool", "controller-gen"}, args...)...)
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("controller-gen %v: %v\n%s", args, err, stderr.Bytes())
		}
		return out
	}

	want := gen("object", "paths=./external/api/...", "output:object:stdout")
	got, err := os.ReadFile("zz_generated.deepcopy.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("zz_generated.deepcopy.go is stale: run make generate")
	}

	crds := gen("crd:crdVersions=v1", "paths=./external/api/...", "output:crd:stdout")
	name := regexp.MustCompile(`(?m)^  name: (\S+)$`)
	docs := bytes.Split(crds, []byte("---\n"))
	n := 0
	for _, doc := range docs {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		m := name.FindSubmatch(doc)
		if m == nil {
			t.Fatalf("a generated CRD has no name:\n%s", doc)
		}
		// controller-gen names each file group_plural.yaml.
		plural, group, _ := bytes.Cut(m[1], []byte("."))
		file := filepath.Join(root, "deploy", "base", "crds", string(group)+"_"+string(plural)+".yaml")
		got, err := os.ReadFile(file)
		if err != nil {
			t.Errorf("%s: %v: run make generate", m[1], err)
			continue
		}
		if !bytes.Equal(got, append([]byte("---\n"), doc...)) {
			t.Errorf("%s is stale: run make generate", file)
		}
		n++
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy", "base", "crds", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 || len(files) != n {
		t.Errorf("controller-gen made %d CRDs, deploy/base/crds holds %d files", n, len(files))
	}
}
