package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/config"
)

// conntrackModuleSysctl exists under /proc/sys in every network namespace
// once the kernel has nf_conntrack loaded.
const conntrackModuleSysctl = "net/netfilter/nf_conntrack_max"

// conntrackSetupCmd sets the conntrack sysctls of run's settings (its
// flags and --config, read as `agent run` reads them) and exits. The
// DaemonSet runs it as a privileged init container, so that the agent
// itself needs no writable /proc/sys: it starts with the values in place,
// finds nothing to write and only stops if an explicit one is missing.
func conntrackSetupCmd(ctx context.Context, args []string, stderr io.Writer) error {
	f, log, err := runSettings("agent conntrack-setup", args, stderr)
	if f == nil {
		return err
	}
	return conntrackSetup(ctx, log, "/proc/sys", f, nodeCPUs(), loadConntrack)
}

// conntrackSetup applies f's conntrack settings under procSys (applyConntrack:
// an explicit setting that cannot be written is an error). The sysctls
// exist only once nf_conntrack is loaded, which the agent's first sync
// would do, later: load has the kernel load it first when they are missing.
func conntrackSetup(ctx context.Context, log *slog.Logger, procSys string, f *config.Settings, cpus int, load func() error) error {
	if len(conntrackSysctls(f.Conntrack, cpus)) == 0 {
		log.InfoContext(ctx, "every conntrack setting is 0: the kernel's values stay")
		return nil
	}
	if _, err := os.Stat(filepath.Join(procSys, conntrackModuleSysctl)); errors.Is(err, fs.ErrNotExist) {
		log.InfoContext(ctx, "nf_conntrack is not loaded yet; asking the kernel for it")
		if err := load(); err != nil {
			return fmt.Errorf("nf_conntrack is not loaded, and a conntrack netlink request did not load it: %w", err)
		}
	}
	if err := applyConntrack(ctx, log, procSys, f.Conntrack, f.Explicit, cpus); err != nil {
		return err
	}
	log.InfoContext(ctx, "conntrack settings in place", "maxPerCore", f.Conntrack.MaxPerCore, "min", f.Conntrack.Min,
		"tcpEstablishedTimeout", f.Conntrack.TCPEstablishedTimeout, "tcpCloseWaitTimeout", f.Conntrack.TCPCloseWaitTimeout,
		"tcpBeLiberal", f.Conntrack.TCPBeLiberal, "udpTimeout", f.Conntrack.UDPTimeout, "udpStreamTimeout", f.Conntrack.UDPStreamTimeout)
	return nil
}

// loadConntrack has the kernel load nf_conntrack as the agent's rules
// would: through a netlink request that needs it, here a dump of the
// (still empty) IPv4 conntrack table. The kernel loads the module itself;
// the container needs no module directory.
func loadConntrack() error {
	h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		return err
	}
	defer h.Close()
	_, err = h.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	return err
}
