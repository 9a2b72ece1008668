package config

import (
	"errors"
	"fmt"
	"time"
)

// Conntrack is the conntrack section (or the --conntrack-* flags),
// resolved: 0 leaves the kernel's value, as in kube-proxy.
type Conntrack struct {
	MaxPerCore            int // nf_conntrack_max = max(MaxPerCore * CPUs, Min), only raised
	Min                   int
	TCPEstablishedTimeout time.Duration
	TCPCloseWaitTimeout   time.Duration
	TCPBeLiberal          bool
	UDPTimeout            time.Duration
	UDPStreamTimeout      time.Duration
}

// ConntrackDefaults are kube-proxy's defaults.
func ConntrackDefaults() Conntrack {
	return Conntrack{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour,
		TCPCloseWaitTimeout: time.Hour}
}

// ConntrackSetting is one conntrack setting: its flag, the file's field
// and the sysctl it sets.
type ConntrackSetting struct {
	Flag, Field, Sysctl string
}

// ConntrackSettings are the conntrack settings by flag name, with the
// file's field and the sysctl each sets.
func ConntrackSettings() []ConntrackSetting {
	return []ConntrackSetting{
		{"conntrack-max-per-core", "conntrack.maxPerCore", "net/netfilter/nf_conntrack_max"},
		{"conntrack-min", "conntrack.min", "net/netfilter/nf_conntrack_max"},
		{"conntrack-tcp-timeout-established", "conntrack.tcpEstablishedTimeout", "net/netfilter/nf_conntrack_tcp_timeout_established"},
		{"conntrack-tcp-timeout-close-wait", "conntrack.tcpCloseWaitTimeout", "net/netfilter/nf_conntrack_tcp_timeout_close_wait"},
		{"conntrack-tcp-be-liberal", "conntrack.tcpBeLiberal", "net/netfilter/nf_conntrack_tcp_be_liberal"},
		{"conntrack-udp-timeout", "conntrack.udpTimeout", "net/netfilter/nf_conntrack_udp_timeout"},
		{"conntrack-udp-timeout-stream", "conntrack.udpStreamTimeout", "net/netfilter/nf_conntrack_udp_timeout_stream"},
	}
}

// ConntrackName names the setting of flag in messages: the file's field
// and the flag.
func ConntrackName(flag string) string {
	for _, s := range ConntrackSettings() {
		if s.Flag == flag {
			return s.Field + " (--" + s.Flag + ")"
		}
	}
	return "--" + flag
}

// resolve fills what the file did not set from base.
func (fc FileConntrack) resolve(base Conntrack) Conntrack {
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
func (fc FileConntrack) set() []string {
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
func (c Conntrack) validate() error {
	var errs []error
	for flag, v := range map[string]int64{
		"conntrack-max-per-core": int64(c.MaxPerCore), "conntrack-min": int64(c.Min),
		"conntrack-tcp-timeout-established": int64(c.TCPEstablishedTimeout),
		"conntrack-tcp-timeout-close-wait":  int64(c.TCPCloseWaitTimeout),
		"conntrack-udp-timeout":             int64(c.UDPTimeout), "conntrack-udp-timeout-stream": int64(c.UDPStreamTimeout),
	} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative", ConntrackName(flag)))
		}
	}
	return errors.Join(errs...)
}
