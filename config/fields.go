package config

// What onehop does with each KubeProxyConfiguration field. docs/migration.md
// holds the same list as a table; a test keeps the two, and the struct's
// fields, in step.
const (
	// fieldApplied: applied as kube-proxy applies it.
	fieldApplied = "applied"
	// fieldRefused: a value onehop cannot honour stops the agent at start
	// with an error naming the field.
	fieldRefused = "refused"
	// fieldNotApplicable: it has no meaning for onehop; a value that is set
	// is named in a warning at start.
	fieldNotApplicable = "not applicable"
)

// kubeProxyField is one field of KubeProxyConfiguration (its JSON path)
// and what onehop does with it.
type kubeProxyField struct {
	Path   string
	Status string
	// Example is a JSON value that is set (not zero) and, for refused and
	// not-applicable fields, gets the error or warning naming the field
	// (with mode nftables). Empty for applied fields.
	Example string
}

// kubeProxyFields lists every field of KubeProxyConfiguration. Containers
// (iptables, conntrack, ...) are not listed, their fields are; logging.options
// is listed as one.
var kubeProxyFields = []kubeProxyField{
	{"featureGates", fieldNotApplicable, `{"SomeGate":true}`},
	{"clientConnection.kubeconfig", fieldApplied, ""},
	{"clientConnection.acceptContentTypes", fieldApplied, ""},
	{"clientConnection.contentType", fieldApplied, ""},
	{"clientConnection.qps", fieldApplied, ""},
	{"clientConnection.burst", fieldApplied, ""},
	{"logging.format", fieldApplied, ""},
	{"logging.verbosity", fieldApplied, ""},
	{"logging.flushFrequency", fieldNotApplicable, `"5s"`},
	{"logging.vmodule", fieldNotApplicable, `[{"filePattern":"x","verbosity":2}]`},
	{"logging.options", fieldNotApplicable, `{"json":{"splitStream":true}}`},
	{"hostnameOverride", fieldApplied, ""},
	{"bindAddress", fieldApplied, ""},
	{"healthzBindAddress", fieldApplied, ""},
	{"metricsBindAddress", fieldApplied, ""},
	{"bindAddressHardFail", fieldApplied, ""},
	{"enableProfiling", fieldApplied, ""},
	{"showHiddenMetricsForVersion", fieldNotApplicable, `"1.36"`},
	{"mode", fieldApplied, ""},
	{"iptables.masqueradeBit", fieldApplied, ""},
	{"iptables.masqueradeAll", fieldApplied, ""},
	{"iptables.localhostNodePorts", fieldNotApplicable, `true`},
	{"iptables.syncPeriod", fieldApplied, ""},
	{"iptables.minSyncPeriod", fieldApplied, ""},
	{"ipvs.syncPeriod", fieldApplied, ""},
	{"ipvs.minSyncPeriod", fieldApplied, ""},
	{"ipvs.scheduler", fieldApplied, ""},
	{"ipvs.excludeCIDRs", fieldNotApplicable, `["10.0.0.0/8"]`},
	{"ipvs.strictARP", fieldApplied, ""},
	{"ipvs.tcpTimeout", fieldRefused, `"900s"`},
	{"ipvs.tcpFinTimeout", fieldRefused, `"120s"`},
	{"ipvs.udpTimeout", fieldRefused, `"300s"`},
	{"nftables.masqueradeBit", fieldApplied, ""},
	{"nftables.masqueradeAll", fieldApplied, ""},
	{"nftables.syncPeriod", fieldApplied, ""},
	{"nftables.minSyncPeriod", fieldApplied, ""},
	{"winkernel.networkName", fieldNotApplicable, `"x"`},
	{"winkernel.sourceVip", fieldNotApplicable, `"10.0.0.1"`},
	{"winkernel.enableDSR", fieldNotApplicable, `true`},
	{"winkernel.rootHnsEndpointName", fieldNotApplicable, `"x"`},
	{"winkernel.forwardHealthCheckVip", fieldNotApplicable, `true`},
	{"detectLocalMode", fieldApplied, ""},
	{"detectLocal.bridgeInterface", fieldRefused, `"cbr0"`},
	{"detectLocal.interfaceNamePrefix", fieldRefused, `"veth"`},
	{"clusterCIDR", fieldApplied, ""},
	{"nodePortAddresses", fieldApplied, ""},
	{"oomScoreAdj", fieldApplied, ""},
	{"conntrack.maxPerCore", fieldApplied, ""},
	{"conntrack.min", fieldApplied, ""},
	{"conntrack.tcpEstablishedTimeout", fieldApplied, ""},
	{"conntrack.tcpCloseWaitTimeout", fieldApplied, ""},
	{"conntrack.tcpBeLiberal", fieldApplied, ""},
	{"conntrack.udpTimeout", fieldApplied, ""},
	{"conntrack.udpStreamTimeout", fieldApplied, ""},
	{"configSyncPeriod", fieldNotApplicable, `"15m"`},
	{"portRange", fieldNotApplicable, `"30000-32767"`},
	{"windowsRunAsService", fieldNotApplicable, `true`},
}
