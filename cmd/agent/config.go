package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeproxy "k8s.io/kube-proxy/config/v1alpha1"
	strictjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/portal"
)

// The kinds a --config file may hold, one YAML document each.
const (
	kubeProxyConfigAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	kubeProxyConfigKind       = "KubeProxyConfiguration"
	onehopConfigAPIVersion    = "onehop.io/v1alpha1"
	onehopConfigKind          = "OnehopConfiguration"
)

// The dataplane names a config file resolves to: the values of --dataplane.
// OnehopConfiguration's dataplane also takes "nftables" for "nft".
const (
	configDataplaneNFTables = "nft"
	configDataplaneIPVS     = "ipvs"
)

// kube-proxy's default ports, used when a bind address has no port.
const (
	configHealthzPort = "10256"
	configMetricsPort = "10249"
)

// onehopConfiguration is onehop's own kind, allowed beside a
// KubeProxyConfiguration in the same file (as a second YAML document):
//
//	apiVersion: onehop.io/v1alpha1
//	kind: OnehopConfiguration
//	dataplane: nftables          # or nft, or ipvs; overrides the kube-proxy mode
//	externalIPCIDRs: [203.0.113.0/24]
//	serviceProxyName: ""         # handle Services labelled service.kubernetes.io/service-proxy-name=<this>
//	sourceRangesOnNodePorts: false
//	balancing: random            # or maglev: the default of Services without onehop.io/balancing
//	serviceLimits: {ports: 5000, sourceRanges: 10000, externalIPs: 100, loadBalancerIPs: 100}
//	external: {...}              # the cloud hook's settings, decoded by package external
type onehopConfiguration struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	Dataplane               string          `json:"dataplane,omitempty"`
	ExternalIPCIDRs         []string        `json:"externalIPCIDRs,omitempty"`
	ServiceProxyName        *string         `json:"serviceProxyName,omitempty"`
	SourceRangesOnNodePorts *bool           `json:"sourceRangesOnNodePorts,omitempty"`
	Balancing               string          `json:"balancing,omitempty"`
	ServiceLimits           *serviceLimits  `json:"serviceLimits,omitempty"`
	External                json.RawMessage `json:"external,omitempty"`
}

// serviceLimits bound what one Service may put into every node's ruleset
// (portal.Limits); a field left out keeps its default. kube-proxy has no
// such limits.
type serviceLimits struct {
	Ports           *int32 `json:"ports,omitempty"`
	SourceRanges    *int32 `json:"sourceRanges,omitempty"`
	ExternalIPs     *int32 `json:"externalIPs,omitempty"`
	LoadBalancerIPs *int32 `json:"loadBalancerIPs,omitempty"`
}

// resolve checks the limits given and returns them; zero fields of the
// result take portal's defaults.
func (sl *serviceLimits) resolve() (portal.Limits, error) {
	var l portal.Limits
	if sl == nil {
		return l, nil
	}
	for _, f := range []struct {
		name string
		v    *int32
		dst  *int
	}{{"ports", sl.Ports, &l.Ports}, {"sourceRanges", sl.SourceRanges, &l.SourceRanges},
		{"externalIPs", sl.ExternalIPs, &l.ExternalIPs}, {"loadBalancerIPs", sl.LoadBalancerIPs, &l.LoadBalancerIPs}} {
		if f.v == nil {
			continue
		}
		if *f.v < 1 {
			return l, fmt.Errorf("serviceLimits.%s %d: want at least 1 (leave it out for the default)", f.name, *f.v)
		}
		*f.dst = int(*f.v)
	}
	return l, nil
}

// fileConfig is what a --config file resolved to. A nil pointer (or nil
// slice) means the file did not set the value, so that flags given
// explicitly on the command line override the file and the file overrides
// the flags' defaults. kube-proxy's "zero means default" fields (0s, null,
// "") count as not set.
type fileConfig struct {
	Path string

	// From the KubeProxyConfiguration.
	HostnameOverride    *string // lower-cased and trimmed, as kube-proxy does
	HealthzBindAddress  *string // host:port; from healthzBindAddress, else from bindAddress
	MetricsBindAddress  *string // host:port; from metricsBindAddress, else from bindAddress
	Profiling           *bool   // enableProfiling (only when true)
	ClusterCIDRs        []netip.Prefix
	NodePortAddresses   *nodePortAddresses
	BindAddressHardFail *bool // only when true
	// Dataplane is "nft" or "ipvs" (as --dataplane): OnehopConfiguration.dataplane,
	// else the kube-proxy mode (iptables, the default, becomes nftables).
	Dataplane *string
	// MasqueradeBit, MasqueradeAll, SyncPeriod and MinSyncPeriod come from
	// the section kube-proxy itself used with this file's mode: iptables.*
	// for mode "" and iptables, nftables.* for nftables, and for ipvs
	// ipvs.syncPeriod/minSyncPeriod with iptables.masqueradeBit/All.
	MasqueradeBit *int32
	MasqueradeAll *bool // only when true
	SyncPeriod    *time.Duration
	MinSyncPeriod *time.Duration
	IPVSScheduler *string
	Conntrack     fileConntrack
	// DetectLocalMode is ClusterCIDR or NodeCIDR (the others are refused).
	DetectLocalMode    *string
	Kubeconfig         *string
	QPS                *float32
	Burst              *int32
	ContentType        *string
	AcceptContentTypes *string
	OOMScoreAdj        *int32
	// IPVSTimeouts names the ipvs.*Timeout fields that are set: refused
	// with the IPVS dataplane, not applicable with nftables.
	IPVSTimeouts   []string
	LogVerbosity   *uint32 // logging.verbosity
	LogFormat      *string // logging.format: text or json
	KubeProxyFound bool    // the file held a KubeProxyConfiguration

	// From the OnehopConfiguration.
	ExternalIPCIDRs         []netip.Prefix
	ServiceProxyName        *string
	SourceRangesOnNodePorts *bool
	// Balancing is balancing (--balancing): random or maglev.
	Balancing *string
	// ServiceLimits are the serviceLimits given; zero fields take the
	// defaults (portal.DefaultLimits).
	ServiceLimits portal.Limits
	// External is the cloud hook's section, as JSON, for package external
	// to decode (strictly); nil when absent.
	External    json.RawMessage
	OnehopFound bool // the file held an OnehopConfiguration
}

// fileConntrack is the conntrack section; nil means kube-proxy's default
// (maxPerCore 32768, min 131072, tcpEstablishedTimeout 24h,
// tcpCloseWaitTimeout 1h, others: leave the kernel's value).
type fileConntrack struct {
	MaxPerCore            *int32
	Min                   *int32
	TCPEstablishedTimeout *time.Duration
	TCPCloseWaitTimeout   *time.Duration
	TCPBeLiberal          *bool // only when true
	UDPTimeout            *time.Duration
	UDPStreamTimeout      *time.Duration
}

// configDoc is one YAML document of a config file and the line it starts on.
type configDoc struct {
	data      []byte
	firstLine int // 1-based line in the file of the document's first line
}

// loadConfigFile reads a --config file: a KubeProxyConfiguration as
// kubeadm's kube-proxy ConfigMap holds it, an OnehopConfiguration, or both
// as two YAML documents. It returns the resolved values and one warning per
// field that is set but does not apply to onehop (for the caller to log
// once). Unknown fields, a wrong apiVersion, bad values and YAML syntax
// errors are errors naming the file, and the field or line.
func loadConfigFile(path string) (*fileConfig, []string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config file: %w", err)
	}
	fc := &fileConfig{Path: path}
	var kp *kubeproxy.KubeProxyConfiguration
	var oh *onehopConfiguration
	for _, doc := range configSplitDocs(raw) {
		js, err := yaml.YAMLToJSONStrict(doc.data)
		if err != nil {
			return nil, nil, configYAMLError(path, doc, err)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue // only comments or blank
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := json.Unmarshal(js, &meta); err != nil {
			return nil, nil, fmt.Errorf("%s:%d: a config document must be a mapping with apiVersion and kind: %v",
				path, doc.firstLine, err)
		}
		at := fmt.Sprintf("%s:%d", path, doc.firstLine)
		switch meta.Kind {
		case kubeProxyConfigKind:
			if meta.APIVersion != kubeProxyConfigAPIVersion {
				return nil, nil, fmt.Errorf("%s: kind %s has apiVersion %q; onehop reads %s",
					at, meta.Kind, meta.APIVersion, kubeProxyConfigAPIVersion)
			}
			if kp != nil {
				return nil, nil, fmt.Errorf("%s: a second %s; give one", at, meta.Kind)
			}
			kp = &kubeproxy.KubeProxyConfiguration{}
			if err := configDecodeStrict(path, doc, js, meta.Kind, kp); err != nil {
				return nil, nil, err
			}
		case onehopConfigKind:
			if meta.APIVersion != onehopConfigAPIVersion {
				return nil, nil, fmt.Errorf("%s: kind %s has apiVersion %q; onehop reads %s",
					at, meta.Kind, meta.APIVersion, onehopConfigAPIVersion)
			}
			if oh != nil {
				return nil, nil, fmt.Errorf("%s: a second %s; give one", at, meta.Kind)
			}
			oh = &onehopConfiguration{}
			if err := configDecodeStrict(path, doc, js, meta.Kind, oh); err != nil {
				return nil, nil, err
			}
		case "":
			return nil, nil, fmt.Errorf("%s: config document has no kind; want %s (%s) or %s (%s)",
				at, kubeProxyConfigKind, kubeProxyConfigAPIVersion, onehopConfigKind, onehopConfigAPIVersion)
		default:
			return nil, nil, fmt.Errorf("%s: unknown kind %q (apiVersion %q); want %s (%s) or %s (%s)",
				at, meta.Kind, meta.APIVersion, kubeProxyConfigKind, kubeProxyConfigAPIVersion,
				onehopConfigKind, onehopConfigAPIVersion)
		}
	}
	if kp == nil && oh == nil {
		return nil, nil, fmt.Errorf("%s: no %s or %s in the file", path, kubeProxyConfigKind, onehopConfigKind)
	}
	var warnings []string
	if oh != nil {
		if err := fc.applyOnehop(oh); err != nil {
			return nil, nil, fmt.Errorf("%s: %s: %w", path, onehopConfigKind, err)
		}
	}
	if kp != nil {
		w, err := fc.applyKubeProxy(kp, oh)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %s: %w", path, kubeProxyConfigKind, err)
		}
		warnings = w
	}
	return fc, warnings, nil
}

// configDocSeparator matches a YAML document separator line.
var configDocSeparator = regexp.MustCompile(`^---(\s.*)?$`)

// configSplitDocs splits a multi-document YAML file, keeping each
// document's first line so that errors can name the file's line.
func configSplitDocs(raw []byte) []configDoc {
	var docs []configDoc
	cur := configDoc{firstLine: 1}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64*1024), len(raw)+1)
	line := 0
	for sc.Scan() {
		line++
		if configDocSeparator.Match(sc.Bytes()) {
			docs = append(docs, cur)
			cur = configDoc{firstLine: line + 1}
			continue
		}
		cur.data = append(cur.data, sc.Bytes()...)
		cur.data = append(cur.data, '\n')
	}
	return append(docs, cur)
}

// configYAMLLine finds "line N" in a YAML parser's message.
var configYAMLLine = regexp.MustCompile(`line (\d+)`)

// configYAMLError turns a YAML parser error about doc into one naming the
// file and the file's line.
func configYAMLError(path string, doc configDoc, err error) error {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "error converting YAML to JSON: ")
	if m := configYAMLLine.FindStringSubmatchIndex(msg); m != nil {
		n, _ := strconv.Atoi(msg[m[2]:m[3]])
		fileLine := doc.firstLine + n - 1
		rest := strings.TrimPrefix(msg[m[1]:], ":")
		return fmt.Errorf("%s:%d: invalid YAML:%s", path, fileLine, rest)
	}
	return fmt.Errorf("%s:%d: invalid YAML in the document starting here: %s", path, doc.firstLine, msg)
}

// configDecodeStrict decodes js (doc as JSON) into out, refusing unknown
// and duplicate fields, case-insensitive matches, and wrong types, with
// errors naming the field's path, the kind and the file's line.
func configDecodeStrict(path string, doc configDoc, js []byte, kind string, out any) error {
	strict, err := strictjson.UnmarshalStrict(js, out,
		strictjson.DisallowDuplicateFields, strictjson.DisallowUnknownFields)
	if err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("%s:%d: %s: field %q: cannot use a %s as %s",
				path, configLineOf(doc, te.Field), kind, te.Field, te.Value, te.Type)
		}
		return fmt.Errorf("%s:%d: %s: %v", path, doc.firstLine, kind, err)
	}
	if len(strict) == 0 {
		return nil
	}
	var msgs []string
	line := doc.firstLine
	for i, e := range strict {
		var fe strictjson.FieldError
		if errors.As(e, &fe) {
			if i == 0 {
				line = configLineOf(doc, fe.FieldPath())
			}
			msg := e.Error()
			if strings.HasPrefix(msg, "unknown field") {
				msg += " (not a field of " + kind + " " + configAPIVersionOf(kind) + "; check the spelling and case)"
			}
			msgs = append(msgs, msg)
			continue
		}
		msgs = append(msgs, e.Error())
	}
	return fmt.Errorf("%s:%d: %s: %s", path, line, kind, strings.Join(msgs, "; "))
}

func configAPIVersionOf(kind string) string {
	if kind == onehopConfigKind {
		return onehopConfigAPIVersion
	}
	return kubeProxyConfigAPIVersion
}

// configLineOf finds, best effort, the file line of the field at fieldPath
// (a.b.c) in doc: the first line, after its parents' lines, whose key is the
// field's last element. It falls back to the document's first line.
func configLineOf(doc configDoc, fieldPath string) int {
	parts := strings.Split(fieldPath, ".")
	lines := strings.Split(string(doc.data), "\n")
	i := 0
	for _, p := range parts {
		if j := strings.IndexByte(p, '['); j >= 0 {
			p = p[:j]
		}
		key := regexp.MustCompile(`^\s*(-\s+)?"?` + regexp.QuoteMeta(p) + `"?\s*:`)
		found := false
		for ; i < len(lines); i++ {
			if key.MatchString(lines[i]) {
				found = true
				break
			}
		}
		if !found {
			return doc.firstLine
		}
	}
	return doc.firstLine + i
}

// applyOnehop resolves the OnehopConfiguration.
func (fc *fileConfig) applyOnehop(oh *onehopConfiguration) error {
	fc.OnehopFound = true
	switch oh.Dataplane {
	case "":
	case configDataplaneNFTables, "nftables":
		fc.Dataplane = ptrTo(configDataplaneNFTables)
	case configDataplaneIPVS:
		fc.Dataplane = ptrTo(configDataplaneIPVS)
	default:
		return fmt.Errorf("dataplane %q: want nftables (or nft) or ipvs", oh.Dataplane)
	}
	for _, s := range oh.ExternalIPCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("externalIPCIDRs: %q is not a CIDR: %w", s, err)
		}
		fc.ExternalIPCIDRs = append(fc.ExternalIPCIDRs, p.Masked())
	}
	if oh.ExternalIPCIDRs != nil && fc.ExternalIPCIDRs == nil {
		fc.ExternalIPCIDRs = []netip.Prefix{} // set, to none: deny all externalIPs
	}
	fc.ServiceProxyName = oh.ServiceProxyName
	fc.SourceRangesOnNodePorts = oh.SourceRangesOnNodePorts
	if oh.Balancing != "" {
		if _, err := parseBalancing(oh.Balancing); err != nil {
			return err
		}
		fc.Balancing = &oh.Balancing
	}
	limits, err := oh.ServiceLimits.resolve()
	if err != nil {
		return err
	}
	fc.ServiceLimits = limits
	if len(oh.External) > 0 && !bytes.Equal(oh.External, []byte("null")) {
		if oh.External[0] != '{' {
			return fmt.Errorf("external: want a mapping, got %s", oh.External)
		}
		if _, err := config.Decode(oh.External); err != nil {
			return fmt.Errorf("external: %w", err)
		}
		fc.External = oh.External
	}
	return nil
}

// applyKubeProxy resolves the KubeProxyConfiguration; oh, when not nil, has
// been applied already (its dataplane wins over the mode).
func (fc *fileConfig) applyKubeProxy(kp *kubeproxy.KubeProxyConfiguration, oh *onehopConfiguration) ([]string, error) {
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
	healthz, err := configHostPort("healthzBindAddress", kp.HealthzBindAddress, configHealthzPort)
	if err != nil {
		return nil, err
	}
	metrics, err := configHostPort("metricsBindAddress", kp.MetricsBindAddress, configMetricsPort)
	if err != nil {
		return nil, err
	}
	if healthz == "" && kp.BindAddress != "" {
		healthz = "0.0.0.0:" + configHealthzPort
		if bindV6 {
			healthz = "[::]:" + configHealthzPort
		}
	}
	if metrics == "" && kp.BindAddress != "" {
		metrics = "127.0.0.1:" + configMetricsPort
		if bindV6 {
			metrics = "[::1]:" + configMetricsPort
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
		fc.ClusterCIDRs, err = configCIDRList("clusterCIDR", strings.Split(kp.ClusterCIDR, ","))
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
		dataplane = configDataplaneNFTables
		masqFrom, periodsFrom = iptables, iptables
		unusedSections = []section{nftables, ipvsPeriods}
		if mode == "iptables" && (oh == nil || oh.Dataplane == "") {
			warn = append(warn, "mode: onehop has no iptables dataplane; using nftables "+
				"(OnehopConfiguration dataplane or --dataplane chooses)")
		}
	case "nftables":
		dataplane = configDataplaneNFTables
		masqFrom, periodsFrom = nftables, nftables
		unusedSections = []section{iptables, ipvsPeriods}
	case "ipvs":
		dataplane = configDataplaneIPVS
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
		if *fc.Dataplane != configDataplaneIPVS {
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
	fc.Conntrack = fileConntrack{
		MaxPerCore:            ct.MaxPerCore,
		Min:                   ct.Min,
		TCPEstablishedTimeout: configDurationPtr(ct.TCPEstablishedTimeout),
		TCPCloseWaitTimeout:   configDurationPtr(ct.TCPCloseWaitTimeout),
		UDPTimeout:            configNonZero(ct.UDPTimeout.Duration),
		UDPStreamTimeout:      configNonZero(ct.UDPStreamTimeout.Duration),
	}
	if ct.TCPBeLiberal {
		fc.Conntrack.TCPBeLiberal = &ct.TCPBeLiberal
	}
	if err := fc.Conntrack.resolve(conntrackDefaults()).validate(); err != nil {
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
	if err := checkClientRate("clientConnection.qps", "clientConnection.burst", float64(cc.QPS), int(cc.Burst)); err != nil {
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
		if err := checkLogFormat("logging.format", f); err != nil {
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
func (fc *fileConfig) applyDetectLocal(kp *kubeproxy.KubeProxyConfiguration, ignore func(field, why string)) error {
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

// configHostPort validates a bind address, appending port when it is a
// bare IP (as kube-proxy does). Empty stays empty.
func configHostPort(field, addr, port string) (string, error) {
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

// configCIDRList parses CIDRs, naming field in errors.
func configCIDRList(field string, list []string) ([]netip.Prefix, error) {
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

func configNonZero(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}

// configDurationPtr copies a nullable duration; an explicit 0 stays 0
// ("leave the kernel's value", as in kube-proxy).
func configDurationPtr(d *metav1.Duration) *time.Duration {
	if d == nil {
		return nil
	}
	v := d.Duration
	return &v
}

func ptrTo[T any](v T) *T { return &v }
