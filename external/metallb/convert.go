package metallb

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"sort"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/external/api/v1alpha1"
)

// Options tune Convert.
type Options struct {
	// SecretNamespace is where onehop reads BGP passwords from: the
	// hook's leaseNamespace (default kube-system).
	SecretNamespace string
}

// Conversion is what Convert made of MetalLB's resources.
type Conversion struct {
	// Objects are onehop's resources (and the Secrets of passwords that
	// MetalLB kept in a BGPPeer), pools first, then peers, BGP and L2
	// advertisements, each kind in input order.
	Objects []ConvertedObject
	// Warnings say what could not be carried over, one sentence each.
	Warnings []string
}

// ConvertedObject is one output object and what its source lost.
type ConvertedObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   convertedMeta     `json:"metadata"`
	Spec       any               `json:"spec,omitempty"`
	StringData map[string]string `json:"stringData,omitempty"` // a Secret's
	// Warnings are those of Conversion.Warnings about this object.
	Warnings []string `json:"-"`
}

type convertedMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// YAML prints the objects as YAML documents, each preceded by its
// warnings as comments.
func (c Conversion) YAML() ([]byte, error) {
	var b bytes.Buffer
	for i, o := range c.Objects {
		if i > 0 {
			b.WriteString("---\n")
		}
		for _, w := range o.Warnings {
			fmt.Fprintf(&b, "# warning: %s\n", strings.ReplaceAll(w, "\n", " "))
		}
		y, err := yaml.Marshal(o)
		if err != nil {
			return nil, err
		}
		b.Write(y)
	}
	return b.Bytes(), nil
}

// Convert turns MetalLB's custom resources, read from YAML (several
// inputs, each of documents separated by "---", a document possibly a
// List), into onehop's onehop.io/v1alpha1 resources. Whatever has no
// onehop equivalent is left out with a warning; only input that is not
// YAML, or not a Kubernetes object, is an error.
func Convert(opts Options, inputs ...[]byte) (Conversion, error) {
	if opts.SecretNamespace == "" {
		opts.SecretNamespace = "kube-system"
	}
	var objs []mlbObject
	for _, in := range inputs {
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(in)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return Conversion{}, err
			}
			got, err := decodeDocument(doc)
			if err != nil {
				return Conversion{}, err
			}
			objs = append(objs, got...)
		}
	}
	cv := &converter{opts: opts, bfd: map[string]mlbBFDProfile{}, names: map[string]bool{}}
	for _, o := range objs {
		if o.Kind == "BFDProfile" && isMetalLB(o) {
			var p mlbBFDProfile
			if cv.decode(o, &p) {
				cv.bfd[o.Metadata.Name] = p
			}
		}
	}
	order := []string{"IPAddressPool", "BGPPeer", "BGPAdvertisement", "L2Advertisement"}
	slices.SortStableFunc(objs, func(a, b mlbObject) int {
		ia, ib := slices.Index(order, a.Kind), slices.Index(order, b.Kind)
		if ia < 0 {
			ia = len(order)
		}
		if ib < 0 {
			ib = len(order)
		}
		return ia - ib
	})
	for _, o := range objs {
		cv.convert(o)
	}
	return cv.out, nil
}

func decodeDocument(doc []byte) ([]mlbObject, error) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return nil, nil
	}
	var o mlbObject
	if err := yaml.Unmarshal(doc, &o); err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	if o.Kind == "" && o.APIVersion == "" {
		if bytes.Contains(bytes.TrimSpace(doc), []byte(":")) {
			return nil, fmt.Errorf("a document is not a Kubernetes object (no kind):\n%s", doc)
		}
		return nil, nil // comments only
	}
	if !strings.HasSuffix(o.Kind, "List") {
		return []mlbObject{o}, nil
	}
	var out []mlbObject
	for _, it := range o.Items {
		got, err := decodeDocument(it)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

func isMetalLB(o mlbObject) bool { return strings.HasPrefix(o.APIVersion, "metallb.io/") }

type converter struct {
	opts  Options
	bfd   map[string]mlbBFDProfile
	names map[string]bool // kind/name already written
	out   Conversion
	cur   []string // warnings of the object being converted
}

func srcName(o mlbObject) string {
	if o.Metadata.Namespace != "" {
		return o.Kind + " " + o.Metadata.Namespace + "/" + o.Metadata.Name
	}
	return o.Kind + " " + o.Metadata.Name
}

// warn records that src lost something.
func (cv *converter) warn(o mlbObject, format string, args ...any) {
	w := srcName(o) + ": " + fmt.Sprintf(format, args...)
	cv.cur = append(cv.cur, w)
	cv.out.Warnings = append(cv.out.Warnings, w)
}

// decode reads o's spec into v, warning of fields it does not know.
func (cv *converter) decode(o mlbObject, v any) bool {
	if len(o.Spec) == 0 {
		return true
	}
	if err := json.Unmarshal(o.Spec, v); err != nil {
		cv.warn(o, "spec does not decode, object skipped: %v", err)
		return false
	}
	var keys map[string]json.RawMessage
	if json.Unmarshal(o.Spec, &keys) == nil {
		known := jsonFields(reflect.TypeOf(v).Elem())
		var unknown []string
		for k := range keys {
			if !known[k] {
				unknown = append(unknown, k)
			}
		}
		sort.Strings(unknown)
		for _, k := range unknown {
			cv.warn(o, "spec.%s is unknown to this converter and left out", k)
		}
	}
	return true
}

// jsonFields are the JSON names of t's fields, embedded structs' included.
func jsonFields(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			for k := range jsonFields(f.Type) {
				out[k] = true
			}
			continue
		}
		out[name] = true
	}
	return out
}

func (cv *converter) convert(o mlbObject) {
	cv.cur = nil
	if !isMetalLB(o) {
		cv.warn(o, "not a MetalLB resource (apiVersion %q), left out", o.APIVersion)
		return
	}
	var obj *ConvertedObject
	var extra []ConvertedObject
	switch o.Kind {
	case "IPAddressPool":
		obj = cv.pool(o)
	case "BGPPeer":
		obj, extra = cv.peer(o)
	case "BGPAdvertisement":
		obj = cv.bgpAd(o)
	case "L2Advertisement":
		obj = cv.l2Ad(o)
	case "BFDProfile":
		return // read with the peers that name it
	default:
		cv.warn(o, "onehop has no equivalent of MetalLB's %s, left out", o.Kind)
	}
	if obj != nil {
		key := obj.Kind + "/" + obj.Metadata.Name
		if cv.names[key] {
			cv.warn(o, "onehop's %s is cluster-scoped and one of that name was converted already, left out", obj.Kind)
			obj = nil
		}
		cv.names[key] = true
	}
	if obj == nil {
		// The warnings stand alone (stderr); no object carries them.
		return
	}
	obj.Warnings = cv.cur
	cv.out.Objects = append(cv.out.Objects, extra...)
	cv.out.Objects = append(cv.out.Objects, *obj)
}

func onehopObject(kind string, o mlbObject, spec any) *ConvertedObject {
	return &ConvertedObject{APIVersion: v1alpha1.GroupVersion.String(), Kind: kind,
		Metadata: convertedMeta{Name: o.Metadata.Name, Labels: o.Metadata.Labels}, Spec: spec}
}
