package config

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeproxy "k8s.io/kube-proxy/config/v1alpha1"
)

// applyKubeProxy resolves the KubeProxyConfiguration; oh, when not nil, has
// been applied already (its dataplane wins over the mode).
func (fc *File) applyKubeProxy(kp *kubeproxy.KubeProxyConfiguration, oh *onehopConfiguration) ([]string, error) {
	fc.KubeProxyFound = true
	var warn []string
	ignore := func(field, why string) {
		warn = append(warn, fmt.Sprintf("%s: ignored: %s", field, why))
	}

	if h := strings.ToLower(strings.TrimSpace(kp.HostnameOverride)); h != "" {
		fc.HostnameOverride = &h
	}

	// Bind addresses, defaulted from bindAddress as kube-proxy does.
	bindV6 := false
	if kp.BindAddress != "" {
		a, err := netip.ParseAddr(kp.BindAddress)
		if err != nil {
			return nil, fmt.Errorf("bindAddress %q is not an IP address", kp.BindAddress)
		}
		bindV6 = a.Is6() && !a.Is4In6()
	}
	healthz, err := hostPort("healthzBindAddress", kp.HealthzBindAddress, healthzPort)
	if err != nil {
		return nil, err
	}
	metrics, err := hostPort("metricsBindAddress", kp.MetricsBindAddress, metricsPort)
	if err != nil {
		return nil, err
	}
	if healthz == "" && kp.BindAddress != "" {
		healthz = "0.0.0.0:" + healthzPort
		if bindV6 {
			healthz = "[::]:" + healthzPort
		}
	}
	if metrics == "" && kp.BindAddress != "" {
		metrics = "127.0.0.1:" + metricsPort
		if bindV6 {
			metrics = "[::1]:" + metricsPort
		}
	}
	if healthz != "" {
		fc.HealthzBindAddress = &healthz
	}
	if metrics != "" {
		fc.MetricsBindAddress = &metrics
	}
	if kp.EnableProfiling {
		fc.Profiling = &kp.EnableProfiling
	}

	if kp.ClusterCIDR != "" {
		fc.ClusterCIDRs, err = cidrList("clusterCIDR", strings.Split(kp.ClusterCIDR, ","))
		if err != nil {
			return nil, err
		}
		if err := checkClusterCIDRs("clusterCIDR", fc.ClusterCIDRs); err != nil {
			return nil, err
		}
	}

	if len(kp.NodePortAddresses) > 0 {
		np, err := parseNodePortAddresses(kp.NodePortAddresses)
		if err != nil {
			return nil, err
		}
		fc.NodePortAddresses = np
	}

	// The mode picks the dataplane and which section kube-proxy read.
	type section struct {
		name                string
		masqBit             *int32
		masqAll             bool
		syncPeriod, minSync time.Duration
	}
	iptables := section{"iptables", kp.IPTables.MasqueradeBit, kp.IPTables.MasqueradeAll,
		kp.IPTables.SyncPeriod.Duration, kp.IPTables.MinSyncPeriod.Duration}
	nftables := section{"nftables", kp.NFTables.MasqueradeBit, kp.NFTables.MasqueradeAll,
		kp.NFTables.SyncPeriod.Duration, kp.NFTables.MinSyncPeriod.Duration}
	ipvsPeriods := section{"ipvs", nil, false, kp.IPVS.SyncPeriod.Duration, kp.IPVS.MinSyncPeriod.Duration}

	var dataplane string
	var masqFrom, periodsFrom section
	var unusedSections []section
	mode := string(kp.Mode)
	switch mode {
	case "", "iptables":
		dataplane = DataplaneNFTables
		masqFrom, periodsFrom = iptables, iptables
		unusedSections = []section{nftables, ipvsPeriods}
		if mode == "iptables" && (oh == nil || oh.Dataplane == "") {
			warn = append(warn, "mode: onehop has no iptables dataplane; using nftables "+
				"(OnehopConfiguration dataplane or --dataplane chooses)")
		}
	case "nftables":
		dataplane = DataplaneNFTables
		masqFrom, periodsFrom = nftables, nftables
		unusedSections = []section{iptables, ipvsPeriods}
	case "ipvs":
		dataplane = DataplaneIPVS
		masqFrom, periodsFrom = iptables, ipvsPeriods
		unusedSections = []section{nftables, {"iptables", nil, false, iptables.syncPeriod, iptables.minSync}}
	case "kernelspace":
		return nil, fmt.Errorf("mode %q is Windows-only; onehop runs on Linux (nftables or ipvs)", mode)
	default:
		return nil, fmt.Errorf("mode %q: want iptables, nftables or ipvs (or empty)", mode)
	}
	if fc.Dataplane == nil {
		fc.Dataplane = &dataplane
	} else if mode != "" && mode != "iptables" && *fc.Dataplane != dataplane {
		warn = append(warn, fmt.Sprintf("mode: %s overridden by %s dataplane %s", mode, onehopConfigKind, *fc.Dataplane))
	}

	if masqFrom.masqBit != nil {
		b := *masqFrom.masqBit
		if b < 0 || b > 31 {
			return nil, fmt.Errorf("%s.masqueradeBit %d: want 0 to 31", masqFrom.name, b)
		}
		fc.MasqueradeBit = &b
	}
	if masqFrom.masqAll {
		fc.MasqueradeAll = &masqFrom.masqAll
	}
	if err := checkSyncPeriods(periodsFrom.name+".syncPeriod", periodsFrom.name+".minSyncPeriod",
		periodsFrom.syncPeriod, periodsFrom.minSync); err != nil {
		return nil, err
	}
	if periodsFrom.syncPeriod > 0 {
		fc.SyncPeriod = &periodsFrom.syncPeriod
	}
	if periodsFrom.minSync > 0 {
		fc.MinSyncPeriod = &periodsFrom.minSync
	}
	for _, s := range unusedSections {
		why := fmt.Sprintf("mode is %q, so kube-proxy used the %s section", mode, periodsFrom.name)
		if s.masqBit != nil {
			ignore(s.name+".masqueradeBit", why)
		}
		if s.masqAll {
			ignore(s.name+".masqueradeAll", why)
		}
		if s.syncPeriod != 0 {
			ignore(s.name+".syncPeriod", why)
		}
		if s.minSync != 0 {
			ignore(s.name+".minSyncPeriod", why)
		}
	}

	if kp.IPVS.Scheduler != "" {
		fc.IPVSScheduler = &kp.IPVS.Scheduler
		if *fc.Dataplane != DataplaneIPVS {
			ignore("ipvs.scheduler", "the dataplane is "+*fc.Dataplane)
		}
	}

	for _, t := range []struct {
		field string
		d     time.Duration
	}{{"ipvs.tcpTimeout", kp.IPVS.TCPTimeout.Duration}, {"ipvs.tcpFinTimeout", kp.IPVS.TCPFinTimeout.Duration},
		{"ipvs.udpTimeout", kp.IPVS.UDPTimeout.Duration}} {
		if t.d < 0 {
			return nil, fmt.Errorf("%s %v must not be negative", t.field, t.d)
		}
		if t.d > 0 {
			fc.IPVSTimeouts = append(fc.IPVSTimeouts, t.field)
		}
	}

	ct := kp.Conntrack
	fc.Conntrack = FileConntrack{
		MaxPerCore:            ct.MaxPerCore,
		Min:                   ct.Min,
		TCPEstablishedTimeout: durationPtr(ct.TCPEstablishedTimeout),
		TCPCloseWaitTimeout:   durationPtr(ct.TCPCloseWaitTimeout),
		UDPTimeout:            nonZero(ct.UDPTimeout.Duration),
		UDPStreamTimeout:      nonZero(ct.UDPStreamTimeout.Duration),
	}
	if ct.TCPBeLiberal {
		fc.Conntrack.TCPBeLiberal = &ct.TCPBeLiberal
	}
	if err := fc.Conntrack.resolve(ConntrackDefaults()).validate(); err != nil {
		return nil, err
	}
	if kp.OOMScoreAdj != nil {
		if v := *kp.OOMScoreAdj; v < -1000 || v > 1000 {
			return nil, fmt.Errorf("oomScoreAdj %d: want -1000 to 1000", v)
		}
		fc.OOMScoreAdj = kp.OOMScoreAdj
	}

	if err := fc.applyDetectLocal(kp, ignore); err != nil {
		return nil, err
	}

	cc := kp.ClientConnection
	if cc.Kubeconfig != "" {
		fc.Kubeconfig = &cc.Kubeconfig
	}
	if err := CheckClientRate("clientConnection.qps", "clientConnection.burst", float64(cc.QPS), int(cc.Burst)); err != nil {
		return nil, err
	}
	if cc.QPS > 0 {
		fc.QPS = &cc.QPS
	}
	if cc.Burst > 0 {
		fc.Burst = &cc.Burst
	}
	if cc.AcceptContentTypes != "" {
		fc.AcceptContentTypes = &cc.AcceptContentTypes
	}
	if cc.ContentType != "" {
		fc.ContentType = &cc.ContentType
	}

	if f := kp.Logging.Format; f != "" {
		if err := CheckLogFormat("logging.format", f); err != nil {
			return nil, err
		}
		fc.LogFormat = &f
	}
	if v := uint32(kp.Logging.Verbosity); v > 0 {
		fc.LogVerbosity = &v
	}
	if kp.Logging.FlushFrequency.Duration.Duration != 0 {
		ignore("logging.flushFrequency", "onehop's log lines are not buffered")
	}
	if len(kp.Logging.VModule) > 0 {
		ignore("logging.vmodule", "onehop has one verbosity level (-v)")
	}
	opts := kp.Logging.Options
	if opts.Text.SplitStream || opts.JSON.SplitStream ||
		!opts.Text.InfoBufferSize.IsZero() || !opts.JSON.InfoBufferSize.IsZero() {
		ignore("logging.options", "onehop writes all log lines to stderr, unbuffered")
	}

	if kp.BindAddressHardFail {
		fc.BindAddressHardFail = &kp.BindAddressHardFail
	}
	// ipvs.strictARP needs nothing: onehop's IPVS dataplane always sets
	// arp_ignore=1 and arp_announce=2, as strictARP: true does.

	// Fields that have no meaning for onehop.
	if len(kp.FeatureGates) > 0 {
		ignore("featureGates", "onehop has no kube-proxy feature gates")
	}
	if kp.ShowHiddenMetricsForVersion != "" {
		ignore("showHiddenMetricsForVersion", "onehop hides no metrics")
	}
	if kp.IPTables.LocalhostNodePorts != nil && *kp.IPTables.LocalhostNodePorts {
		ignore("iptables.localhostNodePorts", "onehop does not serve NodePorts on 127.0.0.1 (as kube-proxy's nftables mode)")
	}
	if len(kp.IPVS.ExcludeCIDRs) > 0 {
		ignore("ipvs.excludeCIDRs", "onehop only ever removes IPVS virtual servers it created")
	}
	w := kp.Winkernel
	for _, f := range []struct {
		name string
		set  bool
	}{{"networkName", w.NetworkName != ""}, {"sourceVip", w.SourceVip != ""}, {"enableDSR", w.EnableDSR},
		{"rootHnsEndpointName", w.RootHnsEndpointName != ""}, {"forwardHealthCheckVip", w.ForwardHealthCheckVip}} {
		if f.set {
			ignore("winkernel."+f.name, "Windows only")
		}
	}
	if kp.WindowsRunAsService {
		ignore("windowsRunAsService", "Windows only")
	}
	if kp.ConfigSyncPeriod.Duration != 0 {
		ignore("configSyncPeriod", "onehop's informers do not resync; the dataplane resyncs every syncPeriod")
	}
	if kp.PortRange != "" {
		ignore("portRange", "onehop has no userspace proxy")
	}
	return warn, nil
}

// applyDetectLocal resolves detectLocalMode and detectLocal.
func (fc *File) applyDetectLocal(kp *kubeproxy.KubeProxyConfiguration, ignore func(field, why string)) error {
	mode := string(kp.DetectLocalMode)
	if err := checkDetectLocalMode(mode); err != nil {
		return err
	}
	why := fmt.Sprintf("detectLocalMode is %q, which does not read it", mode)
	if kp.DetectLocal.BridgeInterface != "" {
		ignore("detectLocal.bridgeInterface", why)
	}
	if kp.DetectLocal.InterfaceNamePrefix != "" {
		ignore("detectLocal.interfaceNamePrefix", why)
	}
	if mode != "" {
		fc.DetectLocalMode = &mode
	}
	return nil
}

// hostPort validates a bind address, appending port when it is a
// bare IP (as kube-proxy does). Empty stays empty.
func hostPort(field, addr, port string) (string, error) {
	if addr == "" {
		return "", nil
	}
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		if _, aerr := netip.ParseAddr(addr); aerr != nil {
			return "", fmt.Errorf("%s %q: want IP:port or IP", field, addr)
		}
		return net.JoinHostPort(addr, port), nil
	}
	if _, err := netip.ParseAddr(host); err != nil && host != "" {
		return "", fmt.Errorf("%s %q: %q is not an IP address", field, addr, host)
	}
	if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
		return "", fmt.Errorf("%s %q: bad port %q", field, addr, p)
	}
	return addr, nil
}

// cidrList parses CIDRs, naming field in errors.
func cidrList(field string, list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a CIDR", field, s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func nonZero(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}

// durationPtr copies a nullable duration; an explicit 0 stays 0
// ("leave the kernel's value", as in kube-proxy).
func durationPtr(d *metav1.Duration) *time.Duration {
	if d == nil {
		return nil
	}
	v := d.Duration
	return &v
}

func ptrTo[T any](v T) *T { return &v }
