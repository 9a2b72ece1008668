package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/onehop/onehop/dataplane"
)

// cleanupCmd removes what onehop installed, for both dataplanes, and nothing
// else; with --kube-proxy-leftovers also kube-proxy's rules.
func cleanupCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent cleanup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	leftovers := fs.Bool("kube-proxy-leftovers", false, "also remove kube-proxy's nftables tables and iptables KUBE-* chains")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	for _, name := range []string{"nft", "ipvs"} {
		dp, err := newDataplane(name, dataplane.Config{}, "", log)
		if err != nil {
			return err
		}
		if err := dp.Cleanup(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Fprintf(stdout, "removed onehop's %s state\n", name)
	}
	if *leftovers {
		removed, err := cleanupKubeProxyLeftovers(ctx, log)
		for _, r := range removed {
			fmt.Fprintf(stdout, "removed kube-proxy leftover %s\n", r)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
