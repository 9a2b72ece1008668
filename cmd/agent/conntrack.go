package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/onehop/onehop/config"
	"github.com/onehop/onehop/dataplane"
)

// nfConntrackMax is the nf_conntrack_max the settings c want on a node with
// cpus CPUs; 0 leaves it alone.
func nfConntrackMax(c config.Conntrack, cpus int) int {
	if c.MaxPerCore <= 0 {
		return 0
	}
	return max(c.MaxPerCore*cpus, c.Min)
}

// conntrackSysctls are the writes the settings c ask for, each naming its
// setting: zero values leave the kernel's.
func conntrackSysctls(c config.Conntrack, cpus int) []dataplane.Sysctl {
	var out []dataplane.Sysctl
	add := func(flag string, v int, onlyRaise bool) {
		for _, s := range config.ConntrackSettings() {
			if s.Flag == flag {
				out = append(out, dataplane.Sysctl{Field: config.ConntrackName(flag), Name: s.Sysctl, Value: v, OnlyRaise: onlyRaise})
			}
		}
	}
	if m := nfConntrackMax(c, cpus); m > 0 {
		flag := "conntrack-max-per-core"
		if m == c.Min && c.MaxPerCore*cpus < c.Min {
			flag = "conntrack-min"
		}
		add(flag, m, true)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"conntrack-tcp-timeout-established", c.TCPEstablishedTimeout}, {"conntrack-tcp-timeout-close-wait", c.TCPCloseWaitTimeout},
		{"conntrack-udp-timeout", c.UDPTimeout}, {"conntrack-udp-timeout-stream", c.UDPStreamTimeout}} {
		if s := int(d.v / time.Second); s > 0 {
			add(d.flag, s, false)
		}
	}
	if c.TCPBeLiberal {
		add("conntrack-tcp-be-liberal", 1, false)
	}
	return out
}

// applyConntrack writes the conntrack sysctls the settings ask for. A
// setting given explicitly (by flag or file: explicit holds its flag name)
// that cannot be written is an error for the caller to stop on, as
// kube-proxy stops; one left at kube-proxy's default is logged, so that an
// agent without a writable /proc/sys still runs. The hash table follows
// nf_conntrack_max as in kube-proxy; failing that is only a warning.
func applyConntrack(ctx context.Context, log *slog.Logger, procSys string, c config.Conntrack, explicit map[string]bool, cpus int) error {
	var fatal []error
	for _, s := range conntrackSysctls(c, cpus) {
		changed, err := dataplane.WriteSysctls(procSys, []dataplane.Sysctl{s})
		for _, ch := range changed {
			log.InfoContext(ctx, "set sysctl", "sysctl", ch.Dotted(), "value", ch.Value, "was", ch.Old, "setting", ch.Field)
			if strings.HasSuffix(ch.Name, "/nf_conntrack_max") {
				if _, err := dataplane.RaiseConntrackHashsize(dataplane.ConntrackHashsizeFile, ch.Value); err != nil {
					log.WarnContext(ctx, "conntrack hash table not resized to nf_conntrack_max/4; lookups may slow down "+
						"when the table fills", "setting", ch.Field, "err", err)
				}
			}
		}
		if err == nil {
			continue
		}
		flag := strings.TrimSuffix(s.Field[strings.Index(s.Field, "(--")+3:], ")")
		if explicit[flag] || (flag == "conntrack-min" && explicit["conntrack-max-per-core"]) ||
			(flag == "conntrack-max-per-core" && explicit["conntrack-min"]) {
			fatal = append(fatal, err)
			continue
		}
		log.ErrorContext(ctx, "kube-proxy's default conntrack setting not applied; set it to 0 to keep the kernel's value "+
			"and silence this", "err", err)
	}
	return errors.Join(fatal...)
}

// nodeCPUs is the number of CPUs the node has online (as kube-proxy counts
// them for conntrack.maxPerCore: the node's, not the container's share),
// falling back to the CPUs this process may use.
func nodeCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return runtime.NumCPU()
	}
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		z := a
		var err2 error
		if isRange {
			z, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || z < a {
			return runtime.NumCPU()
		}
		n += z - a + 1
	}
	if n == 0 {
		return runtime.NumCPU()
	}
	return n
}
