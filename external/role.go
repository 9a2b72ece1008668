package external

// role says which parts of the cloud hook one process runs. The hook has
// two, and they need different privileges:
//
//   - The cluster-wide part, run by one process at a time (elected through
//     the allocator Lease): the allocator, which writes Service status; the
//     webhook sender; and the refusal events. It must be able to update any
//     Service's status.
//   - The per-node part: the providers that announce from this node (BGP,
//     L2, the caller's own) and this node's liveness Lease, with the node's
//     own view of the registry to decide what it announces. It writes only
//     its own Lease.
//
// With the two apart (Config.SeparateController, `agent controller`), a
// compromised node can write no Service's status and no Lease but its own.
type role int

const (
	// roleAll runs both parts in every agent; the agents elect which of
	// them runs the cluster-wide part (Config.SeparateController off).
	roleAll role = iota
	// roleNode runs only the per-node part (`agent run` with
	// Config.SeparateController).
	roleNode
	// roleController runs only the cluster-wide part (`agent controller`).
	roleController
)

// node reports whether the per-node part runs.
func (r role) node() bool { return r != roleController }

// controller reports whether the cluster-wide part runs (when elected).
func (r role) controller() bool { return r != roleNode }

func (r role) String() string {
	switch r {
	case roleNode:
		return "node"
	case roleController:
		return "controller"
	}
	return "all"
}
