package v1alpha1

// The condition every object carries in status.conditions, written by the
// controller (agent controller, or the agent holding the allocator Lease):
// Accepted is True when the object is in force, False with reason Invalid
// and a message saying why when it is not. An object that turns invalid
// keeps its last accepted version in force, where the process applying it
// has seen one.
const (
	ConditionAccepted = "Accepted"

	ReasonAccepted = "Accepted"
	ReasonInvalid  = "Invalid"
)
