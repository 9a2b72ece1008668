package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/onehop/onehop/dataplane"
)

// conntrackConfig is the conntrack section (or the --conntrack-* flags),
// resolved: 0 leaves the kernel's value, as in kube-proxy.
type conntrackConfig struct {
	MaxPerCore            int // nf_conntrack_max = max(MaxPerCore * CPUs, Min), only raised
	Min                   int
	TCPEstablishedTimeout time.Duration
	TCPCloseWaitTimeout   time.Duration
	TCPBeLiberal          bool
	UDPTimeout            time.Duration
	UDPStreamTimeout      time.Duration
}

// conntrackDefaults are kube-proxy's defaults.
func conntrackDefaults() conntrackConfig {
	return conntrackConfig{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour,
		TCPCloseWaitTimeout: time.Hour}
}

// The conntrack settings by flag name, with the file's field and the
// sysctl each sets.
var conntrackSettings = []struct {
	flag, field, sysctl string
}{
	{"conntrack-max-per-core", "conntrack.maxPerCore", "net/netfilter/nf_conntrack_max"},
	{"conntrack-min", "conntrack.min", "net/netfilter/nf_conntrack_max"},
	{"conntrack-tcp-timeout-established", "conntrack.tcpEstablishedTimeout", "net/netfilter/nf_conntrack_tcp_timeout_established"},
	{"conntrack-tcp-timeout-close-wait", "conntrack.tcpCloseWaitTimeout", "net/netfilter/nf_conntrack_tcp_timeout_close_wait"},
	{"conntrack-tcp-be-liberal", "conntrack.tcpBeLiberal", "net/netfilter/nf_conntrack_tcp_be_liberal"},
	{"conntrack-udp-timeout", "conntrack.udpTimeout", "net/netfilter/nf_conntrack_udp_timeout"},
	{"conntrack-udp-timeout-stream", "conntrack.udpStreamTimeout", "net/netfilter/nf_conntrack_udp_timeout_stream"},
}

func conntrackName(flag string) string {
	for _, s := range conntrackSettings {
		if s.flag == flag {
			return s.field + " (--" + s.flag + ")"
		}
	}
	return "--" + flag
}

// resolve fills what the file did not set from base.
func (fc fileConntrack) resolve(base conntrackConfig) conntrackConfig {
	c := base
	if fc.MaxPerCore != nil {
		c.MaxPerCore = int(*fc.MaxPerCore)
	}
	if fc.Min != nil {
		c.Min = int(*fc.Min)
	}
	if fc.TCPEstablishedTimeout != nil {
		c.TCPEstablishedTimeout = *fc.TCPEstablishedTimeout
	}
	if fc.TCPCloseWaitTimeout != nil {
		c.TCPCloseWaitTimeout = *fc.TCPCloseWaitTimeout
	}
	if fc.TCPBeLiberal != nil {
		c.TCPBeLiberal = *fc.TCPBeLiberal
	}
	if fc.UDPTimeout != nil {
		c.UDPTimeout = *fc.UDPTimeout
	}
	if fc.UDPStreamTimeout != nil {
		c.UDPStreamTimeout = *fc.UDPStreamTimeout
	}
	return c
}

// set names the flags of the settings the file sets.
func (fc fileConntrack) set() []string {
	var out []string
	for flag, v := range map[string]bool{
		"conntrack-max-per-core": fc.MaxPerCore != nil, "conntrack-min": fc.Min != nil,
		"conntrack-tcp-timeout-established": fc.TCPEstablishedTimeout != nil,
		"conntrack-tcp-timeout-close-wait":  fc.TCPCloseWaitTimeout != nil,
		"conntrack-tcp-be-liberal":          fc.TCPBeLiberal != nil, "conntrack-udp-timeout": fc.UDPTimeout != nil,
		"conntrack-udp-timeout-stream": fc.UDPStreamTimeout != nil,
	} {
		if v {
			out = append(out, flag)
		}
	}
	return out
}

// validate refuses negative values, as kube-proxy's validation does.
func (c conntrackConfig) validate() error {
	var errs []error
	for flag, v := range map[string]int64{
		"conntrack-max-per-core": int64(c.MaxPerCore), "conntrack-min": int64(c.Min),
		"conntrack-tcp-timeout-established": int64(c.TCPEstablishedTimeout),
		"conntrack-tcp-timeout-close-wait":  int64(c.TCPCloseWaitTimeout),
		"conntrack-udp-timeout":             int64(c.UDPTimeout), "conntrack-udp-timeout-stream": int64(c.UDPStreamTimeout),
	} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative", conntrackName(flag)))
		}
	}
	return errors.Join(errs...)
}

// nfConntrackMax is the nf_conntrack_max the settings want on a node with
// cpus CPUs; 0 leaves it alone.
func (c conntrackConfig) nfConntrackMax(cpus int) int {
	if c.MaxPerCore <= 0 {
		return 0
	}
	return max(c.MaxPerCore*cpus, c.Min)
}

// sysctls are the writes the settings ask for, each naming its setting:
// zero values leave the kernel's.
func (c conntrackConfig) sysctls(cpus int) []dataplane.Sysctl {
	var out []dataplane.Sysctl
	add := func(flag string, v int, onlyRaise bool) {
		for _, s := range conntrackSettings {
			if s.flag == flag {
				out = append(out, dataplane.Sysctl{Field: conntrackName(flag), Name: s.sysctl, Value: v, OnlyRaise: onlyRaise})
			}
		}
	}
	if m := c.nfConntrackMax(cpus); m > 0 {
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
func applyConntrack(ctx context.Context, log *slog.Logger, procSys string, c conntrackConfig, explicit map[string]bool, cpus int) error {
	var fatal []error
	for _, s := range c.sysctls(cpus) {
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
