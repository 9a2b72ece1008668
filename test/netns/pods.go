package netns

import "github.com/onehop/onehop/test/nsutil"

func startEcho(p *Pod, c *Cluster) (*nsutil.EchoServer, error) {
	s, err := nsutil.ServeEcho(p.Netns, p.Name, EchoTCPPorts(), EchoUDPPorts(), c.log)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.servers = append(c.servers, s)
	c.mu.Unlock()
	return s, nil
}

// startPods starts every pod's echo server inside its namespace.
func (c *Cluster) startPods() error {
	for _, n := range c.Nodes {
		for _, p := range n.Pods {
			s, err := startEcho(p, c)
			if err != nil {
				return err
			}
			p.Echo = s
		}
	}
	return nil
}

// Pods returns every pod of the cluster, node by node.
func (c *Cluster) Pods() []*Pod {
	var out []*Pod
	for _, n := range c.Nodes {
		out = append(out, n.Pods...)
	}
	return out
}
