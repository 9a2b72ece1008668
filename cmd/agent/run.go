package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/portal"
)

// runFlags are `agent run`'s settings: flags (named as kube-proxy's where
// one exists) over the --config file over defaults.
type runFlags struct {
	config           string
	kubeconfig       string
	master           string
	hostname         string
	clusterCIDR      string
	serviceCIDR      string
	nodePortAddrs    string
	externalIPCIDRs  string
	minSyncPeriod    time.Duration
	syncPeriod       time.Duration
	fullSyncPeriod   time.Duration
	masqueradeAll    bool
	masqueradeBit    int
	healthzAddr      string
	metricsAddr      string
	dataplane        string
	ipvsScheduler    string
	ipvsCanaryPeriod time.Duration
	serviceProxyName string
	srcRangesOnNP    bool
	balancing        string
	profiling        bool
	verbosity        int
	logFormat        string
	qps              float64
	burst            int
	contentType      string
	apiCompression   bool
	acceptTypes      string
	detectLocalMode  string
	conntrack        conntrackConfig
	oomScoreAdj      int
	bindHardFail     bool
	serviceLimits    portal.Limits // the file's serviceLimits; zero fields take portal's defaults

	external json.RawMessage // the config file's external section
	// explicit holds the flags given on the command line or set by the
	// file (under the flag's name): kube-proxy's defaults are applied
	// softer than what the user asked for.
	explicit map[string]bool
	// Resolved by validate.
	nodePorts *nodePortAddresses
}

func (f *runFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "a KubeProxyConfiguration file (kubeadm's kube-proxy ConfigMap), optionally followed by an OnehopConfiguration document")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; in-cluster configuration when empty")
	fs.StringVar(&f.master, "master", "", "the Kubernetes API server address (overrides the kubeconfig)")
	fs.StringVar(&f.hostname, "hostname-override", "", "this node's name, when it is not the hostname")
	fs.StringVar(&f.clusterCIDR, "cluster-cidr", "", "comma-separated pod CIDRs; traffic to cluster IPs from outside them is masqueraded")
	fs.StringVar(&f.serviceCIDR, "service-cidr", "", "comma-separated service CIDRs, added to those of the ServiceCIDR objects: "+
		"new connections to an unallocated address inside them are dropped, and endpoints inside them are refused")
	fs.StringVar(&f.nodePortAddrs, "nodeport-addresses", "", "comma-separated CIDRs: NodePorts are served on the node's interface addresses inside them (0.0.0.0/0, ::/0: all of the family); default \"primary\": the node's primary IPs from its Node object")
	fs.StringVar(&f.externalIPCIDRs, "external-ip-cidrs", "", "comma-separated CIDRs where spec.externalIPs are allowed (default none: externalIPs are ignored, see CVE-2020-8554)")
	fs.DurationVar(&f.minSyncPeriod, "min-sync-period", 0, "least time between syncs that change the kernel; bursts of changes are batched. "+
		"0: paced by cost (syncs spend a CPU budget that fills at 2% of the time, waiting at most 1s), so a lone change is applied at once")
	fs.DurationVar(&f.syncPeriod, "sync-period", 30*time.Second, "most time between syncs")
	fs.DurationVar(&f.fullSyncPeriod, "full-sync-period", time.Hour, "how often the whole ruleset is compared with the kernel's and repaired in place (affinity entries and counters are kept)")
	fs.BoolVar(&f.masqueradeAll, "masquerade-all", false, "masquerade all traffic to Services")
	fs.IntVar(&f.masqueradeBit, "masquerade-bit", 14, "the packet mark bit (0-31) that requests masquerade")
	fs.StringVar(&f.healthzAddr, "healthz-bind-address", "0.0.0.0:10256", "address of /healthz and /livez; empty disables")
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", "127.0.0.1:10249", "address of /metrics; empty disables")
	fs.StringVar(&f.dataplane, "dataplane", "nft", "the dataplane: nft or ipvs")
	fs.StringVar(&f.ipvsScheduler, "ipvs-scheduler", "rr", "the IPVS scheduler (ipvs dataplane)")
	fs.DurationVar(&f.ipvsCanaryPeriod, "ipvs-canary-period", time.Minute, "how often the drift check runs iptables to see onehop's rules are there (ipvs dataplane; kube-proxy's canary cadence; 0: at every check); IPVS state itself is checked over netlink at every check")
	fs.StringVar(&f.serviceProxyName, "service-proxy-name", "", "serve only Services labelled service.kubernetes.io/service-proxy-name with this value")
	fs.BoolVar(&f.srcRangesOnNP, "source-ranges-on-nodeports", false, "apply loadBalancerSourceRanges to NodePorts too")
	fs.StringVar(&f.balancing, "balancing", "random", "how Services without the onehop.io/balancing annotation pick an endpoint: random, or maglev (consistent hashing: every node picks the same endpoint for a flow; nft dataplane)")
	fs.BoolVar(&f.profiling, "profiling", false, "serve /debug/pprof on the metrics address")
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity; 2 logs every sync")
	fs.StringVar(&f.logFormat, "log-format", "text", "text or json")
	fs.Float64Var(&f.qps, "kube-api-qps", 50, "QPS towards the API server")
	fs.IntVar(&f.burst, "kube-api-burst", 100, "burst towards the API server")
	fs.StringVar(&f.contentType, "kube-api-content-type", "", "content type of requests to the API server (default: client-go's)")
	fs.BoolVar(&f.apiCompression, "kube-api-compression", false, "ask the API server to gzip its answers, watch streams included (costs both sides CPU per event)")
	fs.StringVar(&f.detectLocalMode, "detect-local-mode", "", "how traffic from local pods is told: ClusterCIDR (default, --cluster-cidr) or NodeCIDR (this Node's spec.podCIDRs)")
	d := conntrackDefaults()
	fs.IntVar(&f.conntrack.MaxPerCore, "conntrack-max-per-core", d.MaxPerCore, "nf_conntrack_max per CPU, raised to at least --conntrack-min (0: leave the limit as it is)")
	fs.IntVar(&f.conntrack.Min, "conntrack-min", d.Min, "least nf_conntrack_max, whatever the number of CPUs")
	fs.DurationVar(&f.conntrack.TCPEstablishedTimeout, "conntrack-tcp-timeout-established", d.TCPEstablishedTimeout, "idle timeout of established TCP connections (0: leave as is)")
	fs.DurationVar(&f.conntrack.TCPCloseWaitTimeout, "conntrack-tcp-timeout-close-wait", d.TCPCloseWaitTimeout, "conntrack timeout of TCP connections in CLOSE_WAIT (0: leave as is)")
	fs.BoolVar(&f.conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", false, "set nf_conntrack_tcp_be_liberal: out-of-window TCP packets are not marked INVALID")
	fs.DurationVar(&f.conntrack.UDPTimeout, "conntrack-udp-timeout", 0, "conntrack timeout of unreplied UDP flows (0: leave as is)")
	fs.DurationVar(&f.conntrack.UDPStreamTimeout, "conntrack-udp-timeout-stream", 0, "conntrack timeout of UDP flows that saw replies (0: leave as is)")
	fs.IntVar(&f.oomScoreAdj, "oom-score-adj", -999, "the agent's oom_score_adj, -1000 to 1000 (applied when given)")
	fs.BoolVar(&f.bindHardFail, "bind-address-hard-fail", false, "exit when the health or metrics address cannot be bound")
}

// applyFile fills every setting the command line did not set from the file.
func (f *runFlags) applyFile(fc *fileConfig, set map[string]bool) {
	f.serviceLimits = fc.ServiceLimits
	str := func(name string, dst *string, v *string) {
		if !set[name] && v != nil {
			*dst = *v
		}
	}
	str("hostname-override", &f.hostname, fc.HostnameOverride)
	str("healthz-bind-address", &f.healthzAddr, fc.HealthzBindAddress)
	str("metrics-bind-address", &f.metricsAddr, fc.MetricsBindAddress)
	str("dataplane", &f.dataplane, fc.Dataplane)
	str("ipvs-scheduler", &f.ipvsScheduler, fc.IPVSScheduler)
	str("kubeconfig", &f.kubeconfig, fc.Kubeconfig)
	str("service-proxy-name", &f.serviceProxyName, fc.ServiceProxyName)
	str("balancing", &f.balancing, fc.Balancing)
	str("log-format", &f.logFormat, fc.LogFormat)
	prefixes := func(name string, dst *string, v []netip.Prefix) {
		if !set[name] && len(v) > 0 {
			s := make([]string, len(v))
			for i, p := range v {
				s[i] = p.String()
			}
			*dst = strings.Join(s, ",")
		}
	}
	str("kube-api-content-type", &f.contentType, fc.ContentType)
	if fc.AcceptContentTypes != nil {
		f.acceptTypes = *fc.AcceptContentTypes
	}
	str("detect-local-mode", &f.detectLocalMode, fc.DetectLocalMode)
	prefixes("cluster-cidr", &f.clusterCIDR, fc.ClusterCIDRs)
	prefixes("external-ip-cidrs", &f.externalIPCIDRs, fc.ExternalIPCIDRs)
	if !set["nodeport-addresses"] && fc.NodePortAddresses != nil {
		f.nodePortAddrs = fc.NodePortAddresses.String()
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
	f.conntrack = ct.resolve(f.conntrack)
	for _, flag := range ct.set() {
		f.explicit[flag] = true
	}
	if !set["oom-score-adj"] && fc.OOMScoreAdj != nil {
		f.oomScoreAdj = int(*fc.OOMScoreAdj)
		f.explicit["oom-score-adj"] = true
	}
	if !set["bind-address-hard-fail"] && fc.BindAddressHardFail != nil {
		f.bindHardFail = *fc.BindAddressHardFail
	}
	if !set["profiling"] && fc.Profiling != nil {
		f.profiling = *fc.Profiling
	}
	if !set["masquerade-all"] && fc.MasqueradeAll != nil {
		f.masqueradeAll = *fc.MasqueradeAll
	}
	if !set["masquerade-bit"] && fc.MasqueradeBit != nil {
		f.masqueradeBit = int(*fc.MasqueradeBit)
	}
	if !set["sync-period"] && fc.SyncPeriod != nil {
		f.syncPeriod = *fc.SyncPeriod
	}
	if !set["min-sync-period"] && fc.MinSyncPeriod != nil {
		f.minSyncPeriod = *fc.MinSyncPeriod
	}
	if !set["source-ranges-on-nodeports"] && fc.SourceRangesOnNodePorts != nil {
		f.srcRangesOnNP = *fc.SourceRangesOnNodePorts
	}
	if !set["v"] && fc.LogVerbosity != nil {
		f.verbosity = int(*fc.LogVerbosity)
	}
	if !set["kube-api-qps"] && fc.QPS != nil {
		f.qps = float64(*fc.QPS)
	}
	if !set["kube-api-burst"] && fc.Burst != nil {
		f.burst = int(*fc.Burst)
	}
	f.external = fc.External
}

func parsePrefixes(flagName, s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		p, err := netip.ParsePrefix(part)
		if err != nil {
			return nil, fmt.Errorf("--%s: %q is not a CIDR", flagName, part)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func parseRunFlags(args []string, stderr io.Writer) (*runFlags, []string, error) {
	return parseRunFlagsAs("agent run", args, stderr)
}

// parseRunFlagsAs is parseRunFlags for a command (name) that reads run's
// settings.
func parseRunFlagsAs(name string, args []string, stderr io.Writer) (*runFlags, []string, error) {
	f := &runFlags{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var warnings []string
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	f.explicit = map[string]bool{}
	for name := range set {
		f.explicit[name] = true
	}
	var ipvsTimeouts []string
	if f.config != "" {
		fc, w, err := loadConfigFile(f.config)
		if err != nil {
			return nil, nil, err
		}
		warnings = w
		f.applyFile(fc, set)
		ipvsTimeouts = fc.IPVSTimeouts
	}
	if err := f.validate(); err != nil {
		return nil, nil, err
	}
	for _, field := range ipvsTimeouts {
		if f.dataplane == "ipvs" {
			return nil, nil, fmt.Errorf("%s: %s: onehop's IPVS dataplane does not set IPVS timeouts; leave it 0s "+
				"(conntrack.* sets the connection tracking timeouts)", f.config, field)
		}
		warnings = append(warnings, fmt.Sprintf("%s: ignored: the dataplane is %s, which has no IPVS timeouts", field, f.dataplane))
	}
	return f, warnings, nil
}

// validate checks the merged settings, whether they came from flags or
// the file, with the same checks as the file's loader.
func (f *runFlags) validate() error {
	if f.masqueradeBit < 0 || f.masqueradeBit > 31 {
		return fmt.Errorf("--masquerade-bit %d: must be 0..31", f.masqueradeBit)
	}
	if f.dataplane != "nft" && f.dataplane != "ipvs" {
		return fmt.Errorf("--dataplane %q: must be nft or ipvs", f.dataplane)
	}
	np, err := parseNodePortAddresses(strings.Split(f.nodePortAddrs, ","))
	if err != nil {
		return err
	}
	f.nodePorts = np
	if err := checkDetectLocalMode(f.detectLocalMode); err != nil {
		return err
	}
	if err := f.conntrack.validate(); err != nil {
		return err
	}
	if f.oomScoreAdj < -1000 || f.oomScoreAdj > 1000 {
		return fmt.Errorf("oomScoreAdj (--oom-score-adj) %d: want -1000 to 1000", f.oomScoreAdj)
	}
	for _, c := range []struct{ flag, s string }{{"cluster-cidr", f.clusterCIDR}, {"service-cidr", f.serviceCIDR},
		{"external-ip-cidrs", f.externalIPCIDRs}} {
		if _, err := parsePrefixes(c.flag, c.s); err != nil {
			return err
		}
	}
	cluster, _ := parsePrefixes("cluster-cidr", f.clusterCIDR)
	if err := checkClusterCIDRs("--cluster-cidr", cluster); err != nil {
		return err
	}
	if err := checkSyncPeriods("--sync-period", "--min-sync-period", f.syncPeriod, f.minSyncPeriod); err != nil {
		return err
	}
	if err := checkClientRate("--kube-api-qps", "--kube-api-burst", f.qps, f.burst); err != nil {
		return err
	}
	if err := checkLogFormat("--log-format", f.logFormat); err != nil {
		return err
	}
	if _, err := parseBalancing(f.balancing); err != nil {
		return err
	}
	for _, a := range []struct {
		flag string
		addr *string
		port string
	}{{"--healthz-bind-address", &f.healthzAddr, configHealthzPort}, {"--metrics-bind-address", &f.metricsAddr, configMetricsPort}} {
		hp, err := configHostPort(a.flag, *a.addr, a.port)
		if err != nil {
			return err
		}
		*a.addr = hp // a bare IP gets kube-proxy's port, as in the file
	}
	return nil
}

func nodeName(override string) (string, error) {
	name := override
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("no --hostname-override and no hostname: %w", err)
		}
		name = h
	}
	return strings.ToLower(strings.TrimSpace(name)), nil
}

// runSettings reads run's settings for the command name and makes the
// logger they ask for, which logs the config file's warnings first. After
// -h it returns no settings and no error.
func runSettings(name string, args []string, stderr io.Writer) (*runFlags, *slog.Logger, error) {
	f, warnings, err := parseRunFlagsAs(name, args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, nil
		}
		return nil, nil, err
	}
	log := newLogger(stderr, f.verbosity, f.logFormat)
	for _, w := range warnings {
		log.Warn("config file", "path", f.config, "warning", w)
	}
	return f, log, nil
}

func runCmd(ctx context.Context, args []string, stderr io.Writer) error {
	f, log, err := runSettings("agent run", args, stderr)
	if f == nil {
		return err
	}
	// fatal stops the agent with err: runCmd returns it once everything
	// started has stopped.
	ctx, fatal := context.WithCancelCause(ctx)
	defer fatal(nil)
	node, err := nodeName(f.hostname)
	if err != nil {
		return err
	}
	clusterCIDRs, err := parsePrefixes("cluster-cidr", f.clusterCIDR)
	if err != nil {
		return err
	}
	serviceCIDRs, err := parsePrefixes("service-cidr", f.serviceCIDR)
	if err != nil {
		return err
	}
	extCIDRs, err := parsePrefixes("external-ip-cidrs", f.externalIPCIDRs)
	if err != nil {
		return err
	}
	if f.explicit["oom-score-adj"] {
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(f.oomScoreAdj)), 0o644); err != nil {
			log.Warn("cannot set the agent's oom_score_adj", "setting", "oomScoreAdj (--oom-score-adj)", "value", f.oomScoreAdj, "err", err)
		}
	}

	rc, err := clientcmd.BuildConfigFromFlags(f.master, f.kubeconfig)
	if err != nil {
		return fmt.Errorf("API server configuration: %w", err)
	}
	rc.QPS, rc.Burst = float32(f.qps), f.burst
	rc.ContentType, rc.AcceptContentTypes = f.contentType, f.acceptTypes
	// The API server gzips a watch stream for each watcher on its own, and
	// the agent inflates every event: about a twentieth of the agent's CPU while
	// Services are created, for traffic that stays inside the cluster.
	rc.DisableCompression = rc.DisableCompression || !f.apiCompression
	rc.UserAgent = "onehop-agent/" + version
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	nodeCheck := newNodeCheck(node, client, log, reg)

	localCIDRs := clusterCIDRs
	switch f.detectLocalMode {
	case detectLocalNodeCIDR:
		localCIDRs, err = nodeCheck.waitForPodCIDRs(ctx)
		if err != nil {
			return err
		}
		log.Info("local pod traffic is told by this Node's spec.podCIDRs", "setting", "detectLocalMode NodeCIDR", "pod_cidrs", localCIDRs)
	default:
		if len(clusterCIDRs) == 0 && !f.masqueradeAll {
			log.Warn("detectLocalMode is ClusterCIDR but no clusterCIDR (--cluster-cidr) is set: traffic to cluster IPs from " +
				"outside the pod network is not masqueraded; set clusterCIDR, detectLocalMode NodeCIDR or masqueradeAll")
		}
	}

	dpCfg := dataplane.Config{ClusterCIDRs: localCIDRs, ServiceCIDRs: serviceCIDRs, MasqueradeAll: f.masqueradeAll,
		MasqueradeBit: uint(f.masqueradeBit), SourceRangesOnNodePorts: f.srcRangesOnNP}
	dp, err := newDataplane(f.dataplane, dpCfg, f.ipvsScheduler, f.ipvsCanaryPeriod, log)
	if err != nil {
		return err
	}

	metrics := dataplane.NewMetrics(reg)
	// /proxyMode says the dataplane in kube-proxy's words.
	if f.dataplane == configDataplaneNFTables {
		metrics.SetProxyMode("nftables")
	} else {
		metrics.SetProxyMode(f.dataplane)
	}
	// A health or metrics address that cannot be bound (another process
	// holds it) is retried every few seconds, as in kube-proxy, unless
	// bindAddressHardFail asks to exit.
	var health *dataplane.HealthServer
	// report follows the health and metrics servers: a failure is shown in
	// /healthz (the metrics server's), or ends the agent with
	// bindAddressHardFail.
	report := func(what, addr string) func(error) {
		return func(err error) {
			if err != nil && f.bindHardFail {
				fatal(fmt.Errorf("%s server on %s (bindAddressHardFail): %w", what, addr, err))
			}
			if health != nil && what != "healthz" {
				health.ServerFailed(what, err)
			}
		}
	}
	if f.healthzAddr != "" {
		health = dataplane.NewHealthServer(f.healthzAddr, f.syncPeriod, nil)
		health.SetMetrics(metrics)
		go dataplane.ServeRetrying(ctx, log, "healthz", f.healthzAddr, dataplane.BindRetry, health.Serve,
			report("healthz", f.healthzAddr))
	}
	if f.metricsAddr != "" {
		serve := func(ctx context.Context, ln net.Listener) error {
			return metrics.ServeListener(ctx, ln, reg, f.profiling)
		}
		go dataplane.ServeRetrying(ctx, log, "metrics", f.metricsAddr, dataplane.BindRetry, serve,
			report("metrics", f.metricsAddr))
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "onehop-agent", Host: node})

	balancing, _ := parseBalancing(f.balancing) // checked by validate
	pcfg := portal.Config{NodeName: node, ServiceCIDRs: serviceCIDRs, ExternalIPCIDRs: extCIDRs,
		ServiceProxyName: f.serviceProxyName, Limits: f.serviceLimits, Balancing: balancing}
	var runner *dataplane.Runner
	// A Service's problems are the same on every node: with a controller
	// it puts them on the Service once (reportServiceProblems), and the
	// node agents only log them.
	problems := &portal.EventReporter{Recorder: recorder, Log: log}
	if separateController(f.external) {
		problems.Recorder = nil
	}
	tracker := portal.NewTracker(pcfg, panicCounter{problems, metrics},
		func() {
			if runner != nil {
				runner.Trigger()
			}
		})
	var snapSrc dataplane.SnapshotSource = tracker
	if !f.nodePorts.Primary {
		// NodePorts on the node's interface addresses inside the CIDRs,
		// followed as they change.
		nps := newNodePortSource(tracker, f.nodePorts.CIDRs)
		snapSrc = nps
		if err := nps.follow(ctx, -1, log, func() {
			if runner != nil {
				runner.Trigger()
			}
		}); err != nil {
			return fmt.Errorf("nodePortAddresses (--nodeport-addresses) %s: %w", f.nodePorts, err)
		}
	}
	runner = dataplane.NewRunner(dp, snapSrc, dataplane.RunnerConfig{MinSyncPeriod: f.minSyncPeriod, SyncPeriod: f.syncPeriod, FullSyncPeriod: f.fullSyncPeriod},
		log, health, metrics)
	// The conntrack sysctls, once the first sync has loaded nf_conntrack.
	var conntrackOnce sync.Once
	runner.OnApplied(func(*portal.Snapshot) {
		conntrackOnce.Do(func() {
			if err := applyConntrack(ctx, log, "/proc/sys", f.conntrack, f.explicit, nodeCPUs()); err != nil {
				fatal(err)
			}
		})
	})
	if f.detectLocalMode == detectLocalNodeCIDR {
		runner.OnApplied(func(*portal.Snapshot) {
			if err := podCIDRsChanged(tracker.Node(), localCIDRs); err != nil {
				fatal(err) // as kube-proxy: restart to pick the new ones up
			}
		})
	}
	// Stale UDP/SCTP flows follow endpoint changes.
	conntrack := dataplane.NewConntrackCleaner(log, -1)
	defer conntrack.Close()
	runner.OnApplied(conntrack.OnApplied)
	// Health-check node ports of externalTrafficPolicy: Local Services.
	hcOpts := []dataplane.ServiceHealthOption{}
	if health != nil {
		hcOpts = append(hcOpts, dataplane.WithProxyHealth(health.ProxyHealthy))
	}
	serviceEvent := func(k portal.ServiceKey, reason, message string) {
		ref := tracker.Service(k) // with its UID, so that kubectl describe shows the event
		if ref == nil {
			ref = &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
		}
		recorder.Event(ref, v1.EventTypeWarning, reason, message)
	}
	svcHealth := dataplane.NewServiceHealth(log, serviceEvent, hcOpts...)
	defer svcHealth.Close()
	runner.OnApplied(svcHealth.Update)
	// A Service the backend could not render is left out: its owner is told.
	runner.OnServicePanic(func(p dataplane.ServicePanic) {
		pr := p.Problem()
		serviceEvent(p.Service, pr.Reason, pr.Message)
	})
	// So is the owner of a Service the backend programmed only in part, or
	// not as asked (a scheduler the kernel lacks, a refused virtual server).
	runner.OnServiceProblem(func(p portal.Problem) { serviceEvent(p.Service, p.Reason, p.Message) })
	if health != nil {
		runner.OnApplied(func(*portal.Snapshot) {
			n := tracker.Node()
			if n == nil {
				return
			}
			health.SyncNode(n.DeletionTimestamp != nil, hasTaint(n, "ToBeDeletedByClusterAutoscaler"))
		})
	}

	var watch *portal.ServiceWatch // shared with the cloud hook
	var podIPsReady *atomic.Bool   // set when pod external IPs are served
	var refusedReady *atomic.Bool  // set when the registry's refusals are known
	if len(f.external) > 0 && string(f.external) != "null" {
		ec, err := config.Decode(f.external)
		if err != nil {
			return fmt.Errorf("%s: external section: %w", f.config, err)
		}
		if len(ec.ExternalIPCIDRs) == 0 {
			for _, p := range extCIDRs {
				ec.ExternalIPCIDRs = append(ec.ExternalIPCIDRs, p.String())
			}
		}
		// One watch of Services and EndpointSlices for the model and the
		// hook, which needs them all (external.WithServiceWatch).
		watch = portal.NewServiceWatch(client, 0)
		// A provider that cannot start or update shows in /healthz's
		// providerFailures, onehop_provider_up and events on this Node.
		dyn, err := dynamic.NewForConfig(rc) // the onehop.io custom resources (external.crds)
		if err != nil {
			return err
		}
		hook, err := external.New(ec, client, node, log, external.WithServiceWatch(watch), external.WithProviderHealth(health, metrics),
			external.WithDynamicClient(dyn), external.WithRegisterer(reg))
		if err != nil {
			return fmt.Errorf("%s: external section: %w", f.config, err)
		}
		if hook.Idle() {
			watch = nil // the model watches only its part
		}
		if ec.SeparateController {
			log.Info("cloud hook: this agent runs the per-node part only; `agent controller` allocates, writes Service status and drives the webhook")
		}
		runner.OnApplied(hook.Programmed)
		if ec.PodExternalIPs {
			runner.OnApplied(func(snap *portal.Snapshot) {
				ips := make([]netip.Addr, 0, len(snap.Node.PodExternalIPs))
				for _, p := range snap.Node.PodExternalIPs {
					ips = append(ips, p.External)
				}
				hook.ProgrammedPodIPs(ips)
			})
			podIPsReady = &atomic.Bool{}
			go followPodExternalIPs(ctx, hook, tracker, node, podIPsReady)
		}
		refusedReady = &atomic.Bool{}
		go followRefusedExternalIPs(ctx, hook, tracker, refusedReady)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := hook.Run(ctx); err != nil {
				log.Error("cloud hook stopped", "err", err)
				// Without the hook no registry refuses anything: serve
				// rather than wait for it for ever.
				refusedReady.Store(true)
			}
		}()
		defer func() { <-done }() // withdraw announcements before exiting
	}

	src := &portal.Informers{Client: client, NodeName: node, ServiceProxyName: f.serviceProxyName, Watch: watch,
		ServiceCIDRs: true, Log: log}
	informersSynced, err := src.Start(ctx, tracker)
	if err != nil {
		return err
	}
	// Pod external IPs are part of the first sync too: without them it
	// would remove every pod's 1:1 mapping until the Pod informer caught up.
	// So are the registry's refusals: an external IP another tenant holds
	// must not be served even for a moment.
	synced := func() bool {
		return informersSynced() && (podIPsReady == nil || podIPsReady.Load()) && (refusedReady == nil || refusedReady.Load())
	}
	log.Info("onehop agent starting", "version", version, "node", node, "dataplane", dp.Name(),
		"cluster_cidrs", f.clusterCIDR, "external_ip_cidrs", f.externalIPCIDRs)
	// The existing ruleset keeps serving until the informers have listed
	// everything: the first sync then replaces it in one transaction.
	if err := portal.WaitForSync(ctx, synced); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return cause
		}
		return err
	}
	go nodeCheck.run(ctx, tracker.Node)
	// The heap a burst (the first listing, a storm of changes) left free
	// goes back to the OS once the agent is idle.
	go (&dataplane.MemoryReleaser{LastBusy: runner.LastBusy, Log: log}).Run(ctx)
	runner.Run(ctx)
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("onehop agent stopping; rules stay in place", "err", err)
		return err
	}
	log.Info("onehop agent stopping; rules stay in place (agent cleanup removes them)")
	return nil
}

func hasTaint(n *v1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// followPodExternalIPs hands the tracker the external IPs of this node's
// pods, as the hook computes them from Pods, whenever a Pod changes (and
// every 30 s, in case a change was coalesced away).
// ready is set once the tracker holds what the hook's complete first
// listing says.
// followRefusedExternalIPs keeps the model's list of external IPs that the
// cloud hook's registry gives to someone else up to date; ready is set once
// the registry ran over complete listings.
func followRefusedExternalIPs(ctx context.Context, hook *external.Hook, tracker *portal.Tracker, ready *atomic.Bool) {
	poll := time.NewTicker(50 * time.Millisecond) // until the registry has run
	defer poll.Stop()
	for {
		if refused, ok := hook.RefusedExternalIPs(); ok {
			tracker.SetRefusedExternalIPs(refused)
			if !ready.Load() {
				ready.Store(true)
				poll.Stop()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		case <-hook.RefusedExternalIPsChanged():
		}
	}
}

func followPodExternalIPs(ctx context.Context, hook *external.Hook, tracker *portal.Tracker, node string, ready *atomic.Bool) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	poll := time.NewTicker(50 * time.Millisecond) // until the first listing is complete
	defer poll.Stop()
	for {
		synced := hook.Synced()
		var mine []portal.PodExternalIP
		for _, p := range hook.PodExternalIPs() {
			if p.NodeName == node {
				mine = append(mine, portal.PodExternalIP{External: p.IP, Pod: p.PodIP, Name: p.Pod})
			}
		}
		tracker.SetPodExternalIPs(mine)
		if synced && !ready.Load() {
			ready.Store(true)
			poll.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-poll.C:
		case <-hook.PodsChanged():
		}
	}
}
