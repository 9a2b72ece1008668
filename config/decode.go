package config

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	kubeproxy "k8s.io/kube-proxy/config/v1alpha1"
	strictjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// document is one YAML document of a config file and the line it starts on.
type document struct {
	data      []byte
	firstLine int // 1-based line in the file of the document's first line
}

// LoadFile reads a --config file: a KubeProxyConfiguration as
// kubeadm's kube-proxy ConfigMap holds it, an OnehopConfiguration, or both
// as two YAML documents. It returns the resolved values and one warning per
// field that is set but does not apply to onehop (for the caller to log
// once). Unknown fields, a wrong apiVersion, bad values and YAML syntax
// errors are errors naming the file, and the field or line.
func LoadFile(path string) (*File, []string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config file: %w", err)
	}
	fc := &File{Path: path}
	var kp *kubeproxy.KubeProxyConfiguration
	var oh *onehopConfiguration
	for _, doc := range splitDocs(raw) {
		js, err := yaml.YAMLToJSONStrict(doc.data)
		if err != nil {
			return nil, nil, yamlError(path, doc, err)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue // only comments or blank
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := json.Unmarshal(js, &meta); err != nil {
			return nil, nil, fmt.Errorf("%s:%d: a config document must be a mapping with apiVersion and kind: %v",
				path, doc.firstLine, err)
		}
		at := fmt.Sprintf("%s:%d", path, doc.firstLine)
		switch meta.Kind {
		case kubeProxyConfigKind:
			if meta.APIVersion != kubeProxyConfigAPIVersion {
				return nil, nil, fmt.Errorf("%s: kind %s has apiVersion %q; onehop reads %s",
					at, meta.Kind, meta.APIVersion, kubeProxyConfigAPIVersion)
			}
			if kp != nil {
				return nil, nil, fmt.Errorf("%s: a second %s; give one", at, meta.Kind)
			}
			kp = &kubeproxy.KubeProxyConfiguration{}
			if err := decodeStrict(path, doc, js, meta.Kind, kp); err != nil {
				return nil, nil, err
			}
		case onehopConfigKind:
			if meta.APIVersion != onehopConfigAPIVersion {
				return nil, nil, fmt.Errorf("%s: kind %s has apiVersion %q; onehop reads %s",
					at, meta.Kind, meta.APIVersion, onehopConfigAPIVersion)
			}
			if oh != nil {
				return nil, nil, fmt.Errorf("%s: a second %s; give one", at, meta.Kind)
			}
			oh = &onehopConfiguration{}
			if err := decodeStrict(path, doc, js, meta.Kind, oh); err != nil {
				return nil, nil, err
			}
		case "":
			return nil, nil, fmt.Errorf("%s: config document has no kind; want %s (%s) or %s (%s)",
				at, kubeProxyConfigKind, kubeProxyConfigAPIVersion, onehopConfigKind, onehopConfigAPIVersion)
		default:
			return nil, nil, fmt.Errorf("%s: unknown kind %q (apiVersion %q); want %s (%s) or %s (%s)",
				at, meta.Kind, meta.APIVersion, kubeProxyConfigKind, kubeProxyConfigAPIVersion,
				onehopConfigKind, onehopConfigAPIVersion)
		}
	}
	if kp == nil && oh == nil {
		return nil, nil, fmt.Errorf("%s: no %s or %s in the file", path, kubeProxyConfigKind, onehopConfigKind)
	}
	var warnings []string
	if oh != nil {
		if err := fc.applyOnehop(oh); err != nil {
			return nil, nil, fmt.Errorf("%s: %s: %w", path, onehopConfigKind, err)
		}
	}
	if kp != nil {
		w, err := fc.applyKubeProxy(kp, oh)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %s: %w", path, kubeProxyConfigKind, err)
		}
		warnings = w
	}
	return fc, warnings, nil
}

// docSeparator matches a YAML document separator line.
var docSeparator = regexp.MustCompile(`^---(\s.*)?$`)

// splitDocs splits a multi-document YAML file, keeping each
// document's first line so that errors can name the file's line.
func splitDocs(raw []byte) []document {
	var docs []document
	cur := document{firstLine: 1}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64*1024), len(raw)+1)
	line := 0
	for sc.Scan() {
		line++
		if docSeparator.Match(sc.Bytes()) {
			docs = append(docs, cur)
			cur = document{firstLine: line + 1}
			continue
		}
		cur.data = append(cur.data, sc.Bytes()...)
		cur.data = append(cur.data, '\n')
	}
	return append(docs, cur)
}

// yamlLine finds "line N" in a YAML parser's message.
var yamlLine = regexp.MustCompile(`line (\d+)`)

// yamlError turns a YAML parser error about doc into one naming the
// file and the file's line.
func yamlError(path string, doc document, err error) error {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "error converting YAML to JSON: ")
	if m := yamlLine.FindStringSubmatchIndex(msg); m != nil {
		n, _ := strconv.Atoi(msg[m[2]:m[3]])
		fileLine := doc.firstLine + n - 1
		rest := strings.TrimPrefix(msg[m[1]:], ":")
		return fmt.Errorf("%s:%d: invalid YAML:%s", path, fileLine, rest)
	}
	return fmt.Errorf("%s:%d: invalid YAML in the document starting here: %s", path, doc.firstLine, msg)
}

// decodeStrict decodes js (doc as JSON) into out, refusing unknown
// and duplicate fields, case-insensitive matches, and wrong types, with
// errors naming the field's path, the kind and the file's line.
func decodeStrict(path string, doc document, js []byte, kind string, out any) error {
	strict, err := strictjson.UnmarshalStrict(js, out,
		strictjson.DisallowDuplicateFields, strictjson.DisallowUnknownFields)
	if err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("%s:%d: %s: field %q: cannot use a %s as %s",
				path, lineOf(doc, te.Field), kind, te.Field, te.Value, te.Type)
		}
		return fmt.Errorf("%s:%d: %s: %v", path, doc.firstLine, kind, err)
	}
	if len(strict) == 0 {
		return nil
	}
	var msgs []string
	line := doc.firstLine
	for i, e := range strict {
		var fe strictjson.FieldError
		if errors.As(e, &fe) {
			if i == 0 {
				line = lineOf(doc, fe.FieldPath())
			}
			msg := e.Error()
			if strings.HasPrefix(msg, "unknown field") {
				msg += " (not a field of " + kind + " " + apiVersionOf(kind) + "; check the spelling and case)"
			}
			msgs = append(msgs, msg)
			continue
		}
		msgs = append(msgs, e.Error())
	}
	return fmt.Errorf("%s:%d: %s: %s", path, line, kind, strings.Join(msgs, "; "))
}

func apiVersionOf(kind string) string {
	if kind == onehopConfigKind {
		return onehopConfigAPIVersion
	}
	return kubeProxyConfigAPIVersion
}

// lineOf finds, best effort, the file line of the field at fieldPath
// (a.b.c) in doc: the first line, after its parents' lines, whose key is the
// field's last element. It falls back to the document's first line.
func lineOf(doc document, fieldPath string) int {
	parts := strings.Split(fieldPath, ".")
	lines := strings.Split(string(doc.data), "\n")
	i := 0
	for _, p := range parts {
		if j := strings.IndexByte(p, '['); j >= 0 {
			p = p[:j]
		}
		key := regexp.MustCompile(`^\s*(-\s+)?"?` + regexp.QuoteMeta(p) + `"?\s*:`)
		found := false
		for ; i < len(lines); i++ {
			if key.MatchString(lines[i]) {
				found = true
				break
			}
		}
		if !found {
			return doc.firstLine
		}
	}
	return doc.firstLine + i
}
