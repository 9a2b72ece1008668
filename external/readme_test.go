package external

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// Every example of README.md with an external section decodes strictly,
// so that no example teaches a key the agent refuses.
func TestReadmeExamplesDecode(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile("(?s)```ya?ml\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		if !strings.Contains(m[1], "external:") {
			continue
		}
		var doc map[string]json.RawMessage
		if err := yaml.Unmarshal([]byte(m[1]), &doc); err != nil {
			t.Errorf("example does not parse: %v\n%s", err, m[1])
			continue
		}
		if _, err := DecodeConfig(doc["external"]); err != nil {
			t.Errorf("example's external section: %v\n%s", err, m[1])
		}
		n++
	}
	if n == 0 {
		t.Fatal("README.md has no example with an external section")
	}
	t.Logf("%d examples decode", n)
}
