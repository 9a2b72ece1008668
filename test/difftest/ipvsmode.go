package difftest

import (
	"context"
	"log/slog"
)

// The IPVS comparison: the same twins and cases, with kube-proxy v1.37 in
// its IPVS mode (deprecated, still shipped) on one twin and the agent with
// its IPVS dataplane (deploy/ipvs) on the other. It needs a kernel with
// IPVS, so it runs in the test VM (test/vm), where the host has none.

// ipvsScheduler is both proxies' IPVS scheduler: kube-proxy's default and
// the agent's.
const ipvsScheduler = "rr"

// startIPVSTwins builds the kube-proxy twin and the onehop twin, both on
// IPVS, under dir.
func startIPVSTwins(ctx context.Context, dir string, log *slog.Logger) (*runner, error) {
	r, err := startTwinsWith(ctx, dir, log, func(kp, agent string) [2]twinSpec {
		return [2]twinSpec{
			{"kube-proxy", kubeProxyIPVS{bin: kp}},
			{"onehop", onehopIPVS{&onehopAgent{bin: agent}}},
		}
	})
	if err != nil {
		return nil, err
	}
	r.modeAllowed = ipvsDifferences
	return r, nil
}

// kubeProxyIPVS is kube-proxy in IPVS mode with strict ARP, as MetalLB's
// users set it (arp_ignore 1, arp_announce 2: a node answers ARP only for
// addresses on the interface asked), and the settings kubeProxy gets.
type kubeProxyIPVS struct{ bin string }

func (kubeProxyIPVS) prepare(context.Context, *Twin) error { return nil }

// programmed: IPVS mode has no rule for unallocated cluster IPs.
func (kubeProxyIPVS) programmed(context.Context, *Node) (bool, error) { return true, nil }

func (k kubeProxyIPVS) argv(tw *Twin, n *Node) []string {
	return append([]string{k.bin, "--proxy-mode", "ipvs", "--kubeconfig", tw.CP.Kubeconfig,
		"--ipvs-scheduler", ipvsScheduler, "--ipvs-strict-arp", "--ipvs-min-sync-period", "0s",
		"--v=2"}, sharedFlags(n)...) // v=2: each sync and how long it took (minutes, under the VM's emulation)
}

// onehopIPVS is the agent as deploy/ipvs ships it: --dataplane=ipvs. (Its
// state file, /run/onehop/ipvs-services.json, is one file for both nodes
// here; it names virtual servers for dump-rules and for an agent that
// restarts, and no agent restarts during a comparison.)
type onehopIPVS struct{ *onehopAgent }

func (a onehopIPVS) argv(tw *Twin, n *Node) []string {
	return append(a.onehopAgent.argv(tw, n), "--dataplane", "ipvs", "--ipvs-scheduler", ipvsScheduler)
}

// ipvsDifferences are where the IPVS proxies differ from each other for a
// reason of their own (beyond allowed.go's lists, which hold for every
// mode); docs/difftest.md's section "IPVS" lists them too.
var ipvsDifferences = []allowance{}

// markModeAllowed marks the differences that no list of allowed.go covers
// but one of the mode's allowances does.
func (r *runner) markModeAllowed(c *Case, diffs []difference) {
	for i := range diffs {
		if diffs[i].Allowed != nil {
			continue
		}
		for j := range r.modeAllowed {
			if r.modeAllowed[j].match(c, diffs[i]) {
				diffs[i].Allowed = &r.modeAllowed[j]
				break
			}
		}
	}
}

// runCase generates the case of seed and its changes and runs them
// (runSteps).
func (r *runner) runCase(ctx context.Context, seed uint64) (c *Case, steps []step, diffs []difference, at int, err error) {
	c = generate(seed)
	steps = changes(c.Seed, c)
	diffs, at, err = r.runSteps(ctx, c, steps)
	return c, steps, diffs, at, err
}
