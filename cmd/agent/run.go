package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/config"
	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// nodeName is this node's name: override, else the hostname, lower-cased
// and trimmed as kube-proxy does.
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

// runCmd is `agent run`: it wires the settings into the model, the
// dataplane, the HTTP servers and the cloud hook, and keeps the kernel in
// step with the API server until ctx ends.
func runCmd(ctx context.Context, args []string, stderr io.Writer) error {
	f, log, err := runSettings("agent run", args, stderr)
	if f == nil {
		return err
	}
	// fatal stops the agent with err: runCmd returns it once everything
	// started has stopped.
	ctx, fatal := context.WithCancelCause(ctx)
	defer fatal(nil)
	node, err := nodeName(f.Hostname)
	if err != nil {
		return err
	}
	clusterCIDRs, err := config.ParsePrefixes("cluster-cidr", f.ClusterCIDR)
	if err != nil {
		return err
	}
	serviceCIDRs, err := config.ParsePrefixes("service-cidr", f.ServiceCIDR)
	if err != nil {
		return err
	}
	extCIDRs, err := config.ParsePrefixes("external-ip-cidrs", f.ExternalIPCIDRs)
	if err != nil {
		return err
	}
	if f.Explicit["oom-score-adj"] {
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(f.OOMScoreAdj)), 0o644); err != nil {
			log.Warn("cannot set the agent's oom_score_adj", "setting", "oomScoreAdj (--oom-score-adj)", "value", f.OOMScoreAdj, "err", err)
		}
	}

	rc, err := clientcmd.BuildConfigFromFlags(f.Master, f.Kubeconfig)
	if err != nil {
		return fmt.Errorf("API server configuration: %w", err)
	}
	rc.QPS, rc.Burst = float32(f.QPS), f.Burst
	rc.ContentType, rc.AcceptContentTypes = f.ContentType, f.AcceptContentTypes
	// The API server gzips a watch stream for each watcher on its own, and
	// the agent inflates every event: about a twentieth of the agent's CPU while
	// Services are created, for traffic that stays inside the cluster.
	rc.DisableCompression = rc.DisableCompression || !f.APICompression
	rc.UserAgent = "onehop-agent/" + version
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	nodeCheck := newNodeCheck(node, client, log, reg)

	localCIDRs := clusterCIDRs
	switch f.DetectLocalMode {
	case config.DetectLocalNodeCIDR:
		localCIDRs, err = nodeCheck.waitForPodCIDRs(ctx)
		if err != nil {
			return err
		}
		log.Info("local pod traffic is told by this Node's spec.podCIDRs", "setting", "detectLocalMode NodeCIDR", "pod_cidrs", localCIDRs)
	default:
		if len(clusterCIDRs) == 0 && !f.MasqueradeAll {
			log.Warn("detectLocalMode is ClusterCIDR but no clusterCIDR (--cluster-cidr) is set: traffic to cluster IPs from " +
				"outside the pod network is not masqueraded; set clusterCIDR, detectLocalMode NodeCIDR or masqueradeAll")
		}
	}

	dpCfg := dataplane.Config{ClusterCIDRs: localCIDRs, ServiceCIDRs: serviceCIDRs, MasqueradeAll: f.MasqueradeAll,
		MasqueradeBit: uint(f.MasqueradeBit), SourceRangesOnNodePorts: f.SourceRangesOnNodePorts}
	dp, err := newDataplane(f.Dataplane, dpCfg, f.IPVSScheduler, f.IPVSCanaryPeriod, log)
	if err != nil {
		return err
	}

	metrics := dataplane.NewMetrics(reg)
	// /proxyMode says the dataplane in kube-proxy's words.
	if f.Dataplane == config.DataplaneNFTables {
		metrics.SetProxyMode("nftables")
	} else {
		metrics.SetProxyMode(f.Dataplane)
	}
	health := serveHealthAndMetrics(ctx, f, log, reg, metrics, fatal)

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "onehop-agent", Host: node})

	balancing, _ := config.ParseBalancing(f.Balancing) // checked by Resolve
	pcfg := portal.Config{NodeName: node, ServiceCIDRs: serviceCIDRs, ExternalIPCIDRs: extCIDRs,
		ServiceProxyName: f.ServiceProxyName, Limits: f.ServiceLimits, Balancing: balancing}
	var runner *dataplane.Runner
	// A Service's problems are the same on every node: with a controller
	// it puts them on the Service once (reportServiceProblems), and the
	// node agents only log them.
	problems := &portal.EventReporter{Recorder: recorder, Log: log}
	if separateController(f.External) {
		problems.Recorder = nil
	}
	tracker := portal.NewTracker(pcfg, panicCounter{problems, metrics},
		func() {
			if runner != nil {
				runner.Trigger()
			}
		})
	var snapSrc dataplane.SnapshotSource = tracker
	if !f.NodePorts.Primary {
		// NodePorts on the node's interface addresses inside the CIDRs,
		// followed as they change.
		nps := newNodePortSource(tracker, f.NodePorts.CIDRs)
		snapSrc = nps
		if err := nps.follow(ctx, -1, log, func() {
			if runner != nil {
				runner.Trigger()
			}
		}); err != nil {
			return fmt.Errorf("nodePortAddresses (--nodeport-addresses) %s: %w", f.NodePorts, err)
		}
	}
	runner = dataplane.NewRunner(dp, snapSrc, dataplane.RunnerConfig{MinSyncPeriod: f.MinSyncPeriod, SyncPeriod: f.SyncPeriod, FullSyncPeriod: f.FullSyncPeriod},
		log, health, metrics)
	// The conntrack sysctls, once the first sync has loaded nf_conntrack.
	var conntrackOnce sync.Once
	runner.OnApplied(func(*portal.Snapshot) {
		conntrackOnce.Do(func() {
			if err := applyConntrack(ctx, log, "/proc/sys", f.Conntrack, f.Explicit, nodeCPUs()); err != nil {
				fatal(err)
			}
		})
	})
	if f.DetectLocalMode == config.DetectLocalNodeCIDR {
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
	// A conntrack table near its limit is told, once, and in metrics.
	go dataplane.WatchConntrackFill(ctx, log, metrics, "/proc/sys", dataplane.ConntrackFillPeriod)
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
	// Someone else changed the dataplane's kernel state: the Node is told.
	runner.OnRepair(func(c dataplane.KernelChange) {
		ref := tracker.Node()
		if ref == nil {
			ref = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
		}
		recorder.Eventf(ref, v1.EventTypeWarning, "KernelStateRepaired", "%s state changed by someone else (%s); rewritten", dp.Name(), c)
	})
	if health != nil {
		runner.OnApplied(func(*portal.Snapshot) {
			n := tracker.Node()
			if n == nil {
				return
			}
			health.SyncNode(n.DeletionTimestamp != nil, hasTaint(n, "ToBeDeletedByClusterAutoscaler"))
		})
	}

	// The cloud hook, when the config file has an external section.
	hook := &nodeHook{}
	if len(f.External) > 0 && string(f.External) != "null" {
		hook, err = startNodeHook(ctx, hookWiring{settings: f, extCIDRs: extCIDRs, rest: rc, client: client, node: node,
			log: log, reg: reg, health: health, metrics: metrics, runner: runner, tracker: tracker})
		if err != nil {
			return err
		}
		defer hook.wait() // withdraw announcements before exiting
	}

	src := &portal.Informers{Client: client, NodeName: node, ServiceProxyName: f.ServiceProxyName, Watch: hook.watch,
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
		return informersSynced() && hook.ready()
	}
	log.Info("onehop agent starting", "version", version, "node", node, "dataplane", dp.Name(),
		"cluster_cidrs", f.ClusterCIDR, "external_ip_cidrs", f.ExternalIPCIDRs)
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
