// Package watchscale measures what the API server sends the node agents'
// watches as the cluster grows. It runs one real kube-apiserver (test/cluster)
// and many simulated node agents in this process, each with exactly the
// informers a node agent starts (portal.Informers and the cloud hook,
// through their own constructors, with no dataplane), each with its own
// client whose transport counts the watch events and the bytes it receives.
// Then it changes one object at a time and reports the watch events and
// bytes per change, summed over the agents (docs/bench/watch.md).
//
// TestWatchCounting runs always (3 agents) and checks the counts against
// the watch set the code is meant to have; TestWatchScale runs the curve
// when ONEHOP_WATCHSCALE=1 (make bench-watch).
package watchscale
