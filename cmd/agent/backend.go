package main

import (
	"fmt"
	"log/slog"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/ipvs"
	"github.com/onehop/onehop/nft"
)

// newDataplane builds the backend named by --dataplane.
func newDataplane(name string, cfg dataplane.Config, scheduler string, log *slog.Logger) (dataplane.Dataplane, error) {
	switch name {
	case "nft":
		return nft.New(cfg, nft.WithLogger(log)), nil
	case "ipvs":
		if scheduler == "" {
			scheduler = "rr"
		}
		return ipvs.New(cfg, ipvs.WithScheduler(scheduler), ipvs.WithLogger(log))
	}
	return nil, fmt.Errorf("unknown dataplane %q (nft or ipvs)", name)
}
