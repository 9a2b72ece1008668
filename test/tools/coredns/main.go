// Command coredns is CoreDNS built with the plugins test/node's cluster DNS
// uses, from its Go module (github.com/coredns/coredns), the way CoreDNS
// documents custom builds: import the plugins, list them in order.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"log", "errors", "health", "ready", "cache", "loadbalance", "kubernetes"}
}

func main() { coremain.Run() }
