package config

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Resolve completes settings read from flags: set names the flags given
// on the command line. It reads the --config file (Config), when there is
// one, for every setting the command line did not give, checks the result
// and returns the file's warnings: one per field that is set but does not
// apply to onehop, for the caller to log once.
func (f *Settings) Resolve(set map[string]bool) ([]string, error) {
	var warnings []string
	f.Explicit = map[string]bool{}
	for name := range set {
		f.Explicit[name] = true
	}
	var ipvsTimeouts []string
	if f.Config != "" {
		fc, w, err := LoadFile(f.Config)
		if err != nil {
			return nil, err
		}
		warnings = w
		f.applyFile(fc, set)
		ipvsTimeouts = fc.IPVSTimeouts
	}
	if err := f.validate(); err != nil {
		return nil, err
	}
	for _, field := range ipvsTimeouts {
		if f.Dataplane == "ipvs" {
			return nil, fmt.Errorf("%s: %s: onehop's IPVS dataplane does not set IPVS timeouts; leave it 0s "+
				"(conntrack.* sets the connection tracking timeouts)", f.Config, field)
		}
		warnings = append(warnings, fmt.Sprintf("%s: ignored: the dataplane is %s, which has no IPVS timeouts", field, f.Dataplane))
	}
	return warnings, nil
}

// applyFile fills every setting the command line did not set from the file.
func (f *Settings) applyFile(fc *File, set map[string]bool) {
	f.ServiceLimits = fc.ServiceLimits
	str := func(name string, dst *string, v *string) {
		if !set[name] && v != nil {
			*dst = *v
		}
	}
	str("hostname-override", &f.Hostname, fc.HostnameOverride)
	str("healthz-bind-address", &f.HealthzAddr, fc.HealthzBindAddress)
	str("metrics-bind-address", &f.MetricsAddr, fc.MetricsBindAddress)
	str("dataplane", &f.Dataplane, fc.Dataplane)
	str("ipvs-scheduler", &f.IPVSScheduler, fc.IPVSScheduler)
	str("kubeconfig", &f.Kubeconfig, fc.Kubeconfig)
	str("service-proxy-name", &f.ServiceProxyName, fc.ServiceProxyName)
	str("balancing", &f.Balancing, fc.Balancing)
	str("log-format", &f.LogFormat, fc.LogFormat)
	prefixes := func(name string, dst *string, v []netip.Prefix) {
		if !set[name] && len(v) > 0 {
			s := make([]string, len(v))
			for i, p := range v {
				s[i] = p.String()
			}
			*dst = strings.Join(s, ",")
		}
	}
	str("kube-api-content-type", &f.ContentType, fc.ContentType)
	if fc.AcceptContentTypes != nil {
		f.AcceptContentTypes = *fc.AcceptContentTypes
	}
	str("detect-local-mode", &f.DetectLocalMode, fc.DetectLocalMode)
	prefixes("cluster-cidr", &f.ClusterCIDR, fc.ClusterCIDRs)
	prefixes("external-ip-cidrs", &f.ExternalIPCIDRs, fc.ExternalIPCIDRs)
	if !set["nodeport-addresses"] && fc.NodePortAddresses != nil {
		f.NodePortAddrs = fc.NodePortAddresses.String()
	}
	ct := fc.Conntrack
	for flag, p := range map[string]any{
		"conntrack-max-per-core": &ct.MaxPerCore, "conntrack-min": &ct.Min,
		"conntrack-tcp-timeout-established": &ct.TCPEstablishedTimeout,
		"conntrack-tcp-timeout-close-wait":  &ct.TCPCloseWaitTimeout, "conntrack-tcp-be-liberal": &ct.TCPBeLiberal,
		"conntrack-udp-timeout": &ct.UDPTimeout, "conntrack-udp-timeout-stream": &ct.UDPStreamTimeout,
	} {
		if set[flag] { // the command line wins: forget the file's value
			switch p := p.(type) {
			case **int32:
				*p = nil
			case **time.Duration:
				*p = nil
			case **bool:
				*p = nil
			}
		}
	}
	f.Conntrack = ct.resolve(f.Conntrack)
	for _, flag := range ct.set() {
		f.Explicit[flag] = true
	}
	if !set["oom-score-adj"] && fc.OOMScoreAdj != nil {
		f.OOMScoreAdj = int(*fc.OOMScoreAdj)
		f.Explicit["oom-score-adj"] = true
	}
	if !set["bind-address-hard-fail"] && fc.BindAddressHardFail != nil {
		f.BindAddressHardFail = *fc.BindAddressHardFail
	}
	if !set["profiling"] && fc.Profiling != nil {
		f.Profiling = *fc.Profiling
	}
	if !set["masquerade-all"] && fc.MasqueradeAll != nil {
		f.MasqueradeAll = *fc.MasqueradeAll
	}
	if !set["masquerade-bit"] && fc.MasqueradeBit != nil {
		f.MasqueradeBit = int(*fc.MasqueradeBit)
	}
	if !set["sync-period"] && fc.SyncPeriod != nil {
		f.SyncPeriod = *fc.SyncPeriod
	}
	if !set["min-sync-period"] && fc.MinSyncPeriod != nil {
		f.MinSyncPeriod = *fc.MinSyncPeriod
	}
	if !set["source-ranges-on-nodeports"] && fc.SourceRangesOnNodePorts != nil {
		f.SourceRangesOnNodePorts = *fc.SourceRangesOnNodePorts
	}
	if !set["v"] && fc.LogVerbosity != nil {
		f.Verbosity = int(*fc.LogVerbosity)
	}
	if !set["kube-api-qps"] && fc.QPS != nil {
		f.QPS = float64(*fc.QPS)
	}
	if !set["kube-api-burst"] && fc.Burst != nil {
		f.Burst = int(*fc.Burst)
	}
	f.External = fc.External
}
