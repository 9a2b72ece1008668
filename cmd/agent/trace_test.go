package main

import (
	"bytes"
	"io"
	"net/netip"
	"strings"
	"testing"
)

func TestTraceFlags(t *testing.T) {
	for _, c := range []struct {
		args    []string
		wantErr string // empty: parses
		check   func(t *testing.T, f *traceFlags)
	}{
		{args: []string{"--from", "198.51.100.7", "--to", "203.0.113.10:80/tcp"}, check: func(t *testing.T, f *traceFlags) {
			q := f.query
			if q.From != netip.MustParseAddr("198.51.100.7") || q.FromNode || q.SourcePort != 0 ||
				q.To != netip.MustParseAddrPort("203.0.113.10:80") || q.Protocol != "tcp" || f.output != "text" {
				t.Errorf("parsed %+v", f)
			}
		}},
		{args: []string{"--from", "node", "--to", "10.96.0.10:53/udp", "-o", "json"}, check: func(t *testing.T, f *traceFlags) {
			if !f.query.FromNode || f.query.Protocol != "udp" || f.output != "json" {
				t.Errorf("parsed %+v", f)
			}
		}},
		{args: []string{"--from", "[2001:db8::7]:40000", "--to", "[fd00:96::10]:443/sctp"}, check: func(t *testing.T, f *traceFlags) {
			if f.query.From != netip.MustParseAddr("2001:db8::7") || f.query.SourcePort != 40000 || f.query.Protocol != "sctp" {
				t.Errorf("parsed %+v", f)
			}
		}},
		{args: []string{"--from-pod", "default/web-1", "--to", "10.96.0.10:80"}, check: func(t *testing.T, f *traceFlags) {
			if f.fromPod.Namespace != "default" || f.fromPod.Name != "web-1" || f.query.Protocol != "tcp" {
				t.Errorf("parsed %+v", f)
			}
		}},
		{args: []string{"--from", "198.51.100.7", "--to", "10.96.0.10"}, wantErr: "want address:port/protocol"},
		{args: []string{"--from", "198.51.100.7", "--to", "10.96.0.10:80/icmp"}, wantErr: `protocol "icmp": must be tcp, udp or sctp`},
		{args: []string{"--from", "198.51.100.7", "--to", "10.96.0.10:80/TCP"}, wantErr: "must be tcp, udp or sctp"},
		{args: []string{"--from", "198.51.100.7", "--to", "10.96.0.10:0/tcp"}, wantErr: "port 0"},
		{args: []string{"--from", "198.51.100.7", "--to", "10.96.0.10:99999/tcp"}, wantErr: "want address:port/protocol"},
		{args: []string{"--from", "198.51.100.7"}, wantErr: "--to is required"},
		{args: []string{"--to", "10.96.0.10:80/tcp"}, wantErr: "--from or --from-pod is required"},
		{args: []string{"--from", "pod-a", "--to", "10.96.0.10:80/tcp"}, wantErr: `--from "pod-a": want an address`},
		{args: []string{"--from", "2001:db8::7", "--to", "10.96.0.10:80/tcp"}, wantErr: "not of one family"},
		{args: []string{"--from", "node", "--from-pod", "a/b", "--to", "10.96.0.10:80/tcp"}, wantErr: "give one"},
		{args: []string{"--from-pod", "web-1", "--to", "10.96.0.10:80/tcp"}, wantErr: "must be namespace/name"},
		{args: []string{"--from", "node", "--to", "10.96.0.10:80/tcp", "-o", "yaml"}, wantErr: `-o "yaml"`},
		{args: []string{"--from", "node", "--to", "10.96.0.10:80/tcp", "extra"}, wantErr: `unexpected argument "extra"`},
	} {
		f, err := parseTraceFlags(c.args, io.Discard)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%q: %v", c.args, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%q: want an error saying %q, got %v", c.args, c.wantErr, err)
		case c.check != nil:
			c.check(t, f)
		}
	}
}

// A bad flag is told by the command, with its exit code, before anything
// reads the kernel or the API server.
func TestTraceCommandRefusesBadTo(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := realMain([]string{"trace", "--from", "node", "--to", "10.96.0.10:80/gre"}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "agent trace:") || !strings.Contains(stderr.String(), "must be tcp, udp or sctp") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}
