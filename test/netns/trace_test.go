package netns_test

import (
	"encoding/json"
	"net"
	"slices"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// agentTrace runs the shipped binary's `agent trace -o json` in node's
// namespace, against the node's own kubeconfig, as an operator would.
func agentTrace(t *testing.T, c *netns.Cluster, node *netns.Node, from, to string) *dataplane.Trace {
	t.Helper()
	args := c.AgentArgs(node)
	kubeconfig := ""
	for i, a := range args {
		if a == "--kubeconfig" && i+1 < len(args) {
			kubeconfig = args[i+1]
		}
	}
	out, err := nsutil.Exec(ctxFor(t), node.Netns, args[0], "trace", "--from", from, "--to", to, "-o", "json", "--kubeconfig", kubeconfig)
	if err != nil {
		t.Fatalf("agent trace --from %s --to %s: %v", from, to, err)
	}
	var tr dataplane.Trace
	if err := json.Unmarshal([]byte(out), &tr); err != nil {
		t.Fatalf("agent trace --from %s --to %s: %v:\n%s", from, to, err, out)
	}
	if len(tr.APIServer) > 0 {
		t.Errorf("agent trace --from %s --to %s: the kernel and the API server disagree on a synced Service: %+v", from, to, tr.APIServer)
	}
	return &tr
}

// tracedPods are the pods the trace's outcomes DNAT to (all accepted),
// and the outcome for each, by pod name: whether the connection is
// masqueraded differs by pod (a pod that reaches itself through the
// Service is, hairpin; the others need not be).
func tracedPods(t *testing.T, c *netns.Cluster, tr *dataplane.Trace, port int) (pods []*netns.Pod, outcome map[string]dataplane.TraceOutcome) {
	t.Helper()
	outcome = map[string]dataplane.TraceOutcome{}
	for _, o := range tr.Outcomes {
		if o.Verdict != "accept" || o.Endpoint == "" {
			t.Fatalf("trace %s -> %s: outcome %+v, want a DNAT to a pod", tr.From, tr.To, o)
		}
		host, p, err := net.SplitHostPort(o.Endpoint)
		if err != nil || p != strconv.Itoa(port) {
			t.Fatalf("trace %s -> %s: endpoint %q, want a pod's address and port %d", tr.From, tr.To, o.Endpoint, port)
		}
		i := slices.IndexFunc(c.Pods(), func(p *netns.Pod) bool { return p.IP == host })
		if i < 0 {
			t.Fatalf("trace %s -> %s: endpoint %s is no pod", tr.From, tr.To, o.Endpoint)
		}
		pods = append(pods, c.Pods()[i])
		outcome[c.Pods()[i].Name] = o
	}
	return pods, outcome
}

// testAgentTrace: for each way into a Service, `agent trace` names the
// endpoints new connections reach and whether their source is
// masqueraded, and real connections reach exactly those pods with that
// source; a Service without endpoints is traced as rejected and refuses.
func testAgentTrace(t *testing.T, c *netns.Cluster, _ *latencies) {
	ctx := ctxFor(t)
	node1 := c.Nodes[0]
	pods := c.Pods()
	ext := netns.ExternalIP(31).String()
	s := service("traced", v1.ServiceTypeNodePort, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	s.Spec.ExternalIPs = []string{ext}
	svc, since := expose(t, c, s, pods)
	np := svc.Spec.Ports[0].NodePort
	// Traffic first: the trace reads a table that serves the Service.
	if _, err := netns.WaitBackends(ctx, node1.Pods[0].Netns, "tcp", hostPort(svc.Spec.ClusterIP, 80), pods, since); err != nil {
		t.Fatal(err)
	}

	client := netns.ClientIP().String()
	for _, way := range []struct {
		name, from, fromNetns, to string
	}{
		{"cluster IP from a pod", node1.Pods[0].IP, node1.Pods[0].Netns, hostPort(svc.Spec.ClusterIP, 80)},
		{"NodePort from outside", client, c.ClientNetns, hostPort(node1.IP, np)},
		{"external IP from outside", client, c.ClientNetns, hostPort(ext, 80)},
	} {
		t.Run(way.name, func(t *testing.T) {
			tr := agentTrace(t, c, node1, way.from, way.to+"/tcp")
			if tr.Match == nil {
				t.Fatalf("trace %s -> %s matched no Service:\n%+v", way.from, way.to, tr)
			}
			want, outcome := tracedPods(t, c, tr, netns.PortHTTP)
			// Every pod the trace names answers, and no other.
			if _, err := netns.WaitBackends(ctx, way.fromNetns, "tcp", way.to, want, since); err != nil {
				t.Fatalf("the trace says %v: %v", podNames(want), err)
			}
			// Each connection's source is as the trace says for the pod
			// it reached: several, so that a pod reaching itself is seen
			// too.
			for range 2 * len(want) {
				rep, err := nsutil.Request(ctx, way.fromNetns, "tcp", way.to)
				if err != nil {
					t.Fatal(err)
				}
				o, ok := outcome[rep.Name]
				if !ok {
					t.Fatalf("%s answered, which the trace does not name", rep.Name)
				}
				if kept := rep.SourceIP() == way.from; kept == o.Masquerade {
					t.Errorf("the trace says masquerade %v towards %s (%s), the pod saw source %s from client %s", o.Masquerade, rep.Name, o.Why, rep.SourceIP(), way.from)
				}
			}
		})
	}

	t.Run("no endpoints", func(t *testing.T) {
		empty, _ := expose(t, c, service("traced-empty", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), nil)
		to := hostPort(empty.Spec.ClusterIP, 80)
		from := node1.Pods[0]
		if _, err := netns.WaitUnserved(ctx, from.Netns, "tcp", to, since); err != nil {
			t.Fatal(err)
		}
		tr := agentTrace(t, c, node1, from.IP, to+"/tcp")
		if len(tr.Outcomes) == 0 {
			t.Fatalf("trace of a Service without endpoints has no outcome: %+v", tr)
		}
		for _, o := range tr.Outcomes {
			if o.Verdict != "reject" {
				t.Errorf("trace of a Service without endpoints: outcome %+v, want reject", o)
			}
		}
	})
}

func podNames(pods []*netns.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}
