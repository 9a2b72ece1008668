package config

import (
	"encoding/json"
	"time"

	"github.com/onehop/onehop/portal"
)

// Settings are `agent run`'s settings: flags (named as kube-proxy's where
// one exists) over the --config file over defaults. Resolve merges and
// checks them.
type Settings struct {
	Config                  string
	Kubeconfig              string
	Master                  string
	Hostname                string
	ClusterCIDR             string
	ServiceCIDR             string
	NodePortAddrs           string
	ExternalIPCIDRs         string
	MinSyncPeriod           time.Duration
	SyncPeriod              time.Duration
	FullSyncPeriod          time.Duration
	MasqueradeAll           bool
	MasqueradeBit           int
	HealthzAddr             string
	MetricsAddr             string
	Dataplane               string
	IPVSScheduler           string
	IPVSCanaryPeriod        time.Duration
	ServiceProxyName        string
	SourceRangesOnNodePorts bool
	Balancing               string
	Profiling               bool
	Verbosity               int
	LogFormat               string
	QPS                     float64
	Burst                   int
	ContentType             string
	APICompression          bool
	AcceptContentTypes      string
	DetectLocalMode         string
	Conntrack               Conntrack
	OOMScoreAdj             int
	BindAddressHardFail     bool
	ServiceLimits           portal.Limits // the file's serviceLimits; zero fields take portal's defaults

	External json.RawMessage // the config file's external section
	// Explicit holds the flags given on the command line or set by the
	// file (under the flag's name): kube-proxy's defaults are applied
	// softer than what the user asked for.
	Explicit map[string]bool
	// NodePorts is NodePortAddrs parsed, by Resolve.
	NodePorts *NodePortAddresses
}

// Defaults are the settings' defaults, kube-proxy's where it has the
// setting: the flags' defaults.
func Defaults() Settings {
	return Settings{
		SyncPeriod:       30 * time.Second,
		FullSyncPeriod:   time.Hour,
		MasqueradeBit:    14,
		HealthzAddr:      "0.0.0.0:" + healthzPort,
		MetricsAddr:      "127.0.0.1:" + metricsPort,
		Dataplane:        DataplaneNFTables,
		IPVSScheduler:    "rr",
		IPVSCanaryPeriod: time.Minute,
		Balancing:        portal.BalancingRandom.String(),
		LogFormat:        "text",
		QPS:              50,
		Burst:            100,
		Conntrack:        ConntrackDefaults(),
		OOMScoreAdj:      -999,
	}
}
