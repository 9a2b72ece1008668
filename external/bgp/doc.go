// Package bgp is the cloud hook's BGP provider: an embedded GoBGP v4 speaker
// that announces /32 and /128 routes to the configured peers with this node
// as the next hop. It takes no route from its peers and passes none on:
// its policy accepts its own announcements alone, and a peer that sends
// more routes than its prefix limit has its session ended. It knows
// nothing of Kubernetes: it is told which addresses to announce
// (Speaker.Set), and withdraws them all before it stops (Speaker.Stop),
// unless it stops for the agent's restart with peers that have graceful
// restart, whose routers then keep the routes (Speaker.StopForRestart).
//
// Build the agent with -tags grpcnotrace: GoBGP pulls in gRPC, whose tracing
// otherwise roughly doubles the binary.
//
// It must not import package external or any of its other subpackages.
package bgp
