// Package pressure tests the agent under pressure, each case end to end on
// a namespace cluster (package test/netns): API objects in, packets out,
// with the real agent binary. The pressures are an API server that answers
// 429 and 503 for minutes, a watch whose history was compacted away, a full
// conntrack table on a node, and a node whose address changes. Requests
// from pods measure what traffic sees; the agent's /metrics, its log and
// /proc measure what it did.
//
// The API server outage lasts two minutes; $ONEHOP_PRESSURE_OUTAGE (a Go
// duration) shortens it while developing.
//
// A case that needs to shape what the agent hears from kube-apiserver puts
// a reverse proxy, run by the test process inside the node's namespace,
// between that node's agent and the API server (proxy_test.go).
//
// The package holds tests only. It talks to the agent as a cluster would
// (the API, the kernel, /metrics) and imports none of its packages: only
// test/netns, test/nsutil and test/cluster. No packet leaves the namespaces
// its clusters create, and every namespace and process goes when a test
// ends, pass or fail.
package pressure
