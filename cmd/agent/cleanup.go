package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/onehop/onehop/dataplane"
)

// ipvsProcFile exists in a network namespace once the kernel has IPVS
// loaded. thread-self, not self: the caller may be a thread switched into
// another network namespace.
const ipvsProcFile = "/proc/thread-self/net/ip_vs"

// cleanupCmd removes what onehop installed, for both dataplanes, and
// nothing else. With --kube-proxy-leftovers it removes kube-proxy's state
// instead, and leaves onehop's alone: that is the migration step run while
// onehop serves.
func cleanupCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("agent cleanup", flag.ContinueOnError)
	flags.SetOutput(stderr)
	leftovers := flags.Bool("kube-proxy-leftovers", false,
		"remove only kube-proxy's nftables tables and iptables KUBE-* chains; onehop's own state stays")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if flags.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flags.Args())
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if *leftovers {
		removed, err := cleanupKubeProxyLeftovers(ctx, log)
		for _, r := range removed {
			fmt.Fprintf(stdout, "removed kube-proxy leftover %s\n", r)
		}
		return err
	}
	return cleanupOnehop(ctx, stdout, log)
}

// cleanupOnehop removes onehop's state of each dataplane present in the
// kernel. A dataplane the kernel does not have holds nothing of onehop's,
// so it is skipped without a word: no IPVS errors on an nftables node.
func cleanupOnehop(ctx context.Context, stdout io.Writer, log *slog.Logger) error {
	for _, name := range []string{"nft", "ipvs"} {
		if name == "ipvs" && !ipvsLoaded() {
			log.DebugContext(ctx, "no IPVS in this kernel; nothing of onehop's to remove there")
			continue
		}
		dp, err := newDataplane(name, dataplane.Config{}, "", time.Minute, log)
		if err != nil {
			return err
		}
		if err := dp.Cleanup(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Fprintf(stdout, "removed onehop's %s state\n", name)
	}
	return nil
}

// ipvsLoaded reports whether the calling thread's network namespace has
// IPVS, without loading the module. When in doubt (the file cannot be
// checked for another reason) it says yes, so the cleanup is tried.
func ipvsLoaded() bool {
	_, err := os.Stat(ipvsProcFile)
	return !errors.Is(err, fs.ErrNotExist)
}
