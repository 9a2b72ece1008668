package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/onehop/onehop/config"
)

// registerRunFlags defines run's flags on fs, with the settings' defaults,
// to be read into f.
func registerRunFlags(fs *flag.FlagSet, f *config.Settings) {
	d := config.Defaults()
	fs.StringVar(&f.Config, "config", d.Config, "a KubeProxyConfiguration file (kubeadm's kube-proxy ConfigMap), optionally followed by an OnehopConfiguration document")
	fs.StringVar(&f.Kubeconfig, "kubeconfig", d.Kubeconfig, "kubeconfig file; in-cluster configuration when empty")
	fs.StringVar(&f.Master, "master", d.Master, "the Kubernetes API server address (overrides the kubeconfig)")
	fs.StringVar(&f.Hostname, "hostname-override", d.Hostname, "this node's name, when it is not the hostname")
	fs.StringVar(&f.ClusterCIDR, "cluster-cidr", d.ClusterCIDR, "comma-separated pod CIDRs; traffic to cluster IPs from outside them is masqueraded")
	fs.StringVar(&f.ServiceCIDR, "service-cidr", d.ServiceCIDR, "comma-separated service CIDRs, added to those of the ServiceCIDR objects: "+
		"new connections to an unallocated address inside them are dropped, and endpoints inside them are refused")
	fs.StringVar(&f.NodePortAddrs, "nodeport-addresses", d.NodePortAddrs, "comma-separated CIDRs: NodePorts are served on the node's interface addresses inside them (0.0.0.0/0, ::/0: all of the family); default \"primary\": the node's primary IPs from its Node object")
	fs.StringVar(&f.ExternalIPCIDRs, "external-ip-cidrs", d.ExternalIPCIDRs, "comma-separated CIDRs where spec.externalIPs are allowed (default none: externalIPs are ignored, see CVE-2020-8554)")
	fs.DurationVar(&f.MinSyncPeriod, "min-sync-period", d.MinSyncPeriod, "least time between syncs that change the kernel; bursts of changes are batched. "+
		"0: paced by cost (syncs spend a CPU budget that fills at 2% of the time, waiting at most 1s), so a lone change is applied at once")
	fs.DurationVar(&f.SyncPeriod, "sync-period", d.SyncPeriod, "most time between syncs")
	fs.DurationVar(&f.FullSyncPeriod, "full-sync-period", d.FullSyncPeriod, "how often the whole ruleset is compared with the kernel's and repaired in place (affinity entries and counters are kept)")
	fs.BoolVar(&f.MasqueradeAll, "masquerade-all", d.MasqueradeAll, "masquerade all traffic to Services")
	fs.IntVar(&f.MasqueradeBit, "masquerade-bit", d.MasqueradeBit, "the packet mark bit (0-31) that requests masquerade")
	fs.StringVar(&f.HealthzAddr, "healthz-bind-address", d.HealthzAddr, "address of /healthz and /livez; empty disables")
	fs.StringVar(&f.MetricsAddr, "metrics-bind-address", d.MetricsAddr, "address of /metrics; empty disables")
	fs.StringVar(&f.Dataplane, "dataplane", d.Dataplane, "the dataplane: nft or ipvs")
	fs.StringVar(&f.IPVSScheduler, "ipvs-scheduler", d.IPVSScheduler, "the IPVS scheduler (ipvs dataplane)")
	fs.DurationVar(&f.IPVSCanaryPeriod, "ipvs-canary-period", d.IPVSCanaryPeriod, "how often the drift check runs iptables to see onehop's rules are there (ipvs dataplane; kube-proxy's canary cadence; 0: at every check); IPVS state itself is checked over netlink at every check")
	fs.StringVar(&f.ServiceProxyName, "service-proxy-name", d.ServiceProxyName, "serve only Services labelled service.kubernetes.io/service-proxy-name with this value")
	fs.BoolVar(&f.SourceRangesOnNodePorts, "source-ranges-on-nodeports", d.SourceRangesOnNodePorts, "apply loadBalancerSourceRanges to NodePorts too")
	fs.StringVar(&f.Balancing, "balancing", d.Balancing, "how Services without the onehop.io/balancing annotation pick an endpoint: random, or maglev (consistent hashing: every node picks the same endpoint for a flow; nft dataplane)")
	fs.BoolVar(&f.Profiling, "profiling", d.Profiling, "serve /debug/pprof on the metrics address")
	fs.IntVar(&f.Verbosity, "v", d.Verbosity, "log verbosity; 2 logs every sync")
	fs.StringVar(&f.LogFormat, "log-format", d.LogFormat, "text or json")
	fs.Float64Var(&f.QPS, "kube-api-qps", d.QPS, "QPS towards the API server")
	fs.IntVar(&f.Burst, "kube-api-burst", d.Burst, "burst towards the API server")
	fs.StringVar(&f.ContentType, "kube-api-content-type", d.ContentType, "content type of requests to the API server (default: client-go's)")
	fs.BoolVar(&f.APICompression, "kube-api-compression", d.APICompression, "ask the API server to gzip its answers, watch streams included (costs both sides CPU per event)")
	fs.StringVar(&f.DetectLocalMode, "detect-local-mode", d.DetectLocalMode, "how traffic from local pods is told: ClusterCIDR (default, --cluster-cidr) or NodeCIDR (this Node's spec.podCIDRs)")
	fs.IntVar(&f.Conntrack.MaxPerCore, "conntrack-max-per-core", d.Conntrack.MaxPerCore, "nf_conntrack_max per CPU, raised to at least --conntrack-min (0: leave the limit as it is)")
	fs.IntVar(&f.Conntrack.Min, "conntrack-min", d.Conntrack.Min, "least nf_conntrack_max, whatever the number of CPUs")
	fs.DurationVar(&f.Conntrack.TCPEstablishedTimeout, "conntrack-tcp-timeout-established", d.Conntrack.TCPEstablishedTimeout, "idle timeout of established TCP connections (0: leave as is)")
	fs.DurationVar(&f.Conntrack.TCPCloseWaitTimeout, "conntrack-tcp-timeout-close-wait", d.Conntrack.TCPCloseWaitTimeout, "conntrack timeout of TCP connections in CLOSE_WAIT (0: leave as is)")
	fs.BoolVar(&f.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", d.Conntrack.TCPBeLiberal, "set nf_conntrack_tcp_be_liberal: out-of-window TCP packets are not marked INVALID")
	fs.DurationVar(&f.Conntrack.UDPTimeout, "conntrack-udp-timeout", d.Conntrack.UDPTimeout, "conntrack timeout of unreplied UDP flows (0: leave as is)")
	fs.DurationVar(&f.Conntrack.UDPStreamTimeout, "conntrack-udp-timeout-stream", d.Conntrack.UDPStreamTimeout, "conntrack timeout of UDP flows that saw replies (0: leave as is)")
	fs.IntVar(&f.OOMScoreAdj, "oom-score-adj", d.OOMScoreAdj, "the agent's oom_score_adj, -1000 to 1000 (applied when given)")
	fs.BoolVar(&f.BindAddressHardFail, "bind-address-hard-fail", d.BindAddressHardFail, "exit when the health or metrics address cannot be bound")
}

func parseRunFlags(args []string, stderr io.Writer) (*config.Settings, []string, error) {
	return parseRunFlagsAs("agent run", args, stderr)
}

// parseRunFlagsAs is parseRunFlags for a command (name) that reads run's
// settings: the flags given over the --config file over the defaults
// (config.Settings.Resolve), and the file's warnings.
func parseRunFlagsAs(name string, args []string, stderr io.Writer) (*config.Settings, []string, error) {
	f := &config.Settings{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	registerRunFlags(fs, f)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	warnings, err := f.Resolve(set)
	if err != nil {
		return nil, nil, err
	}
	return f, warnings, nil
}

// runSettings reads run's settings for the command name and makes the
// logger they ask for, which logs the config file's warnings first. After
// -h it returns no settings and no error.
func runSettings(name string, args []string, stderr io.Writer) (*config.Settings, *slog.Logger, error) {
	f, warnings, err := parseRunFlagsAs(name, args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, nil
		}
		return nil, nil, err
	}
	log := newLogger(stderr, f.Verbosity, f.LogFormat)
	for _, w := range warnings {
		log.Warn("config file", "path", f.Config, "warning", w)
	}
	return f, log, nil
}
