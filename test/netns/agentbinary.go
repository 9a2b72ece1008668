package netns

import "context"

// AgentBinary returns $ONEHOP_AGENT or the agent as shipped (`make build`)
// built into dir, as the namespace cluster runs it, for other test
// packages that run the agent themselves.
func AgentBinary(ctx context.Context, dir string) (string, error) {
	return agentBinary(ctx, "", dir)
}
