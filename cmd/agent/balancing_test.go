package main

import (
	"io"
	"strings"
	"testing"
)

// The cluster-wide default balancing comes from --balancing or the
// OnehopConfiguration's balancing; the flag wins; a bad value is refused
// by both, naming it.
func TestBalancingFlagAndFile(t *testing.T) {
	file := func(v string) string {
		return writeConfig(t, "apiVersion: onehop.io/v1alpha1\nkind: OnehopConfiguration\nbalancing: "+v+"\n")
	}
	for _, tc := range []struct {
		name string
		args []string
		want string // "" for an error
	}{
		{"default", nil, "random"},
		{"flag", []string{"--balancing", "maglev"}, "maglev"},
		{"file", []string{"--config", file("maglev")}, "maglev"},
		{"the flag over the file", []string{"--config", file("maglev"), "--balancing", "random"}, "random"},
		{"bad flag", []string{"--balancing", "hash"}, ""},
		{"bad file", []string{"--config", file("Maglev")}, ""},
	} {
		f, _, err := parseRunFlags(tc.args, io.Discard)
		switch {
		case tc.want == "" && (err == nil || !strings.Contains(err.Error(), "balancing")):
			t.Errorf("%s: err %v, want one about balancing", tc.name, err)
		case tc.want != "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && f.Balancing != tc.want:
			t.Errorf("%s: balancing %q, want %q", tc.name, f.Balancing, tc.want)
		}
	}
}
