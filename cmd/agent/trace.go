package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// traceFlags are the flags of agent trace.
type traceFlags struct {
	query      dataplane.TraceQuery
	fromPod    portal.ServiceKey // namespace/name of a pod; empty when not given
	output     string
	dataplane  string
	kubeconfig string
	master     string
}

// parseTraceFlags reads the flags of agent trace; it needs neither the
// kernel nor the API server.
func parseTraceFlags(args []string, stderr io.Writer) (*traceFlags, error) {
	fs := flag.NewFlagSet("agent trace", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &traceFlags{}
	from := fs.String("from", "", "the client: an address (198.51.100.7, or with its port 198.51.100.7:40000), or node for this node itself")
	fromPod := fs.String("from-pod", "", "the client is this pod, namespace/name (its address is read from the API server)")
	to := fs.String("to", "", "the destination: address:port/protocol, e.g. 10.96.0.10:80/tcp or [fd00:96::10]:53/udp (protocol tcp, udp or sctp; default tcp)")
	fs.StringVar(&f.output, "o", "text", "output: text or json")
	fs.StringVar(&f.dataplane, "dataplane", "nft", "the dataplane to read: nft")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file: --from-pod reads the pod, and the trace says where the API server and the kernel disagree")
	fs.StringVar(&f.master, "master", "", "the Kubernetes API server address (overrides the kubeconfig)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if f.output != "text" && f.output != "json" {
		return nil, fmt.Errorf("-o %q: must be text or json", f.output)
	}
	var err error
	if f.query.To, f.query.Protocol, err = parseTraceTo(*to); err != nil {
		return nil, err
	}
	switch {
	case *from != "" && *fromPod != "":
		return nil, errors.New("--from and --from-pod: give one")
	case *fromPod != "":
		ns, name, ok := strings.Cut(*fromPod, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("--from-pod %q: must be namespace/name", *fromPod)
		}
		f.fromPod = portal.ServiceKey{Namespace: ns, Name: name}
	case *from == "node":
		f.query.FromNode = true
	case *from != "":
		if f.query.From, f.query.SourcePort, err = parseTraceFrom(*from); err != nil {
			return nil, err
		}
		if f.query.From.Is4() != f.query.To.Addr().Is4() {
			return nil, fmt.Errorf("--from %s and --to %s are not of one family", *from, *to)
		}
	default:
		return nil, errors.New("--from or --from-pod is required (an address, node, or namespace/name of a pod)")
	}
	return f, nil
}

// parseTraceTo reads address:port/protocol.
func parseTraceTo(s string) (netip.AddrPort, string, error) {
	if s == "" {
		return netip.AddrPort{}, "", errors.New("--to is required: address:port/protocol, e.g. 10.96.0.10:80/tcp")
	}
	addr, proto, hasProto := strings.Cut(s, "/")
	if !hasProto {
		proto = "tcp"
	}
	if _, ok := portal.ParseProtocol(proto); !ok || strings.ToLower(proto) != proto {
		return netip.AddrPort{}, "", fmt.Errorf("--to %q: protocol %q: must be tcp, udp or sctp", s, proto)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return netip.AddrPort{}, "", fmt.Errorf("--to %q: want address:port/protocol, e.g. 10.96.0.10:80/tcp or [fd00:96::10]:53/udp: %w", s, err)
	}
	if ap.Port() == 0 {
		return netip.AddrPort{}, "", fmt.Errorf("--to %q: port 0 is no Service port", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), proto, nil
}

// parseTraceFrom reads an address, with or without a port.
func parseTraceFrom(s string) (netip.Addr, uint16, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), 0, nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("--from %q: want an address (198.51.100.7), an address and port (198.51.100.7:40000) or node", s)
	}
	return ap.Addr().Unmap(), ap.Port(), nil
}

// traceCmd tells which way a packet goes through the kernel's ruleset.
func traceCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseTraceFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	var client kubernetes.Interface
	if f.kubeconfig != "" || f.master != "" || f.fromPod.Name != "" {
		rc, err := clientcmd.BuildConfigFromFlags(f.master, f.kubeconfig)
		if err != nil {
			return fmt.Errorf("API server configuration: %w", err)
		}
		rc.UserAgent = "onehop-trace/" + version
		rc.Timeout = 10 * time.Second
		if client, err = kubernetes.NewForConfig(rc); err != nil {
			return err
		}
	}
	if f.fromPod.Name != "" {
		if f.query.From, err = podAddr(ctx, client, f.fromPod, f.query.To.Addr().Is4()); err != nil {
			return err
		}
	}
	dp, err := newDataplane(f.dataplane, dataplane.Config{}, "", time.Minute, log)
	if err != nil {
		return err
	}
	tracer, ok := dp.(dataplane.Tracer)
	if !ok {
		return fmt.Errorf("the %s dataplane cannot trace", f.dataplane)
	}
	t, err := tracer.Trace(ctx, f.query)
	if err != nil {
		return err
	}
	if f.fromPod.Name != "" {
		t.From = "pod " + f.fromPod.String() + " (" + t.From + ")"
	}
	if client != nil {
		if t.APIServer, err = compareAPIServer(ctx, client, t, f.query); err != nil {
			t.Notes = append(t.Notes, "not compared with the API server: "+err.Error())
		}
	}
	if f.output == "json" {
		return t.WriteJSON(stdout)
	}
	return t.WriteText(stdout)
}
