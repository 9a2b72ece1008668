package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/ipvs"
	"github.com/onehop/onehop/nft"
)

// newDataplane builds the backend named by --dataplane. canary is how
// often the IPVS backend's drift check runs iptables (0: every check).
func newDataplane(name string, cfg dataplane.Config, scheduler string, canary time.Duration, log *slog.Logger) (dataplane.Dataplane, error) {
	switch name {
	case "nft":
		return nft.New(cfg, nft.WithLogger(log)), nil
	case "ipvs":
		if scheduler == "" {
			scheduler = "rr"
		}
		return ipvs.New(cfg, ipvs.WithScheduler(scheduler), ipvs.WithCanaryPeriod(canary), ipvs.WithLogger(log))
	}
	return nil, fmt.Errorf("unknown dataplane %q (nft or ipvs)", name)
}
