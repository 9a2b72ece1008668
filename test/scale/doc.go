// Package scale measures the real agent, end to end, against a real
// kube-apiserver holding many Services: the namespace cluster of package
// test/netns (two nodes, real agents, real pods), plus N Services with E
// endpoints each written through the API as the EndpointSlice controller
// writes them.
//
// TestEndToEndScale measures, on node 1's agent:
//
//   - the agent's CPU while the objects are created, and the time from the
//     last write until a Service created last answers;
//   - resident memory (VmRSS, VmHWM) and Go heap once synced;
//   - one endpoint change until traffic follows (p50, max over flips),
//     with a request loop from a pod that must never fail;
//   - a warm restart (SIGKILL, start, until /healthz is 200 and the first
//     full sync is done) under the same loop;
//   - a cold restart (SIGKILL, `agent cleanup`, start) until the Service
//     answers again: a rebooted node;
//   - the full sync's own duration (kubeproxy_sync_full_proxy_rules_duration_seconds).
//
// With ONEHOP_SCALE_PRELOAD=1 (`make bench-e2e` from 50k Services) the
// objects are written while no agent runs, and the nodes then join: the
// figures are node 1's start until the Service created last answers, and
// its CPU until then, instead of the storm of writes; kube-proxy starts
// once they are written, too.
//
// In `make test` it runs small (ONEHOP_SCALE_SERVICES, default 300) and
// proves correctness: no failed connection, every flip followed. `make
// bench-e2e` runs it at 10k and 50k Services and appends the figures, with
// the machine's load, to docs/bench/e2e.md (ONEHOP_SCALE_REPORT). No
// wall-clock figure is a pass/fail threshold.
package scale
