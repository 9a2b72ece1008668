package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/onehop/onehop/config"
	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external"
	extconfig "github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/portal"
)

// controllerFlags are `agent controller`'s settings. It reads the same
// --config file as the node agents (their ConfigMap), for the external
// section and externalIPCIDRs.
type controllerFlags struct {
	config          string
	kubeconfig      string
	master          string
	identity        string
	healthzAddr     string
	externalIPCIDRs string
	verbosity       int
	logFormat       string
	qps             float64
	burst           int
}

func (f *controllerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "the node agents' config file (KubeProxyConfiguration and OnehopConfiguration); its external section configures the controller")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; default: the config file's clientConnection.kubeconfig, else in-cluster configuration")
	fs.StringVar(&f.master, "master", "", "the Kubernetes API server address (overrides the kubeconfig)")
	fs.StringVar(&f.identity, "identity", "", "this candidate's name in the leader Lease (default $POD_NAME, else the hostname)")
	fs.StringVar(&f.healthzAddr, "healthz-bind-address", "0.0.0.0:10258", "address of /healthz and /metrics; empty disables")
	fs.StringVar(&f.externalIPCIDRs, "external-ip-cidrs", "", "comma-separated CIDRs where spec.externalIPs are allowed (default: the config file's externalIPCIDRs)")
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity")
	fs.StringVar(&f.logFormat, "log-format", "text", "text or json")
	fs.Float64Var(&f.qps, "kube-api-qps", 20, "QPS towards the API server")
	fs.IntVar(&f.burst, "kube-api-burst", 40, "burst towards the API server")
}

// controllerCmd runs the cluster-wide part of the cloud hook: the
// leader-elected LoadBalancer IP allocator (it writes Service status), the
// webhook sender and the refusal events. The node agents then run with
// external.separateController and write nothing cluster-wide.
func controllerCmd(ctx context.Context, args []string, stderr io.Writer) error {
	f := &controllerFlags{}
	fs := flag.NewFlagSet("agent controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if err := config.CheckClientRate("--kube-api-qps", "--kube-api-burst", f.qps, f.burst); err != nil {
		return err
	}
	if err := config.CheckLogFormat("--log-format", f.logFormat); err != nil {
		return err
	}
	log := newLogger(stderr, f.verbosity, f.logFormat)

	var ext json.RawMessage
	var cidrs []string
	var limits portal.Limits
	proxyName := ""
	if f.config != "" {
		fc, _, err := config.LoadFile(f.config)
		if err != nil {
			return err
		}
		ext = fc.External
		for _, p := range fc.ExternalIPCIDRs {
			cidrs = append(cidrs, p.String())
		}
		limits = fc.ServiceLimits
		if fc.ServiceProxyName != nil {
			proxyName = *fc.ServiceProxyName
		}
		if !set["kubeconfig"] && fc.Kubeconfig != nil {
			f.kubeconfig = *fc.Kubeconfig
		}
	}
	if set["external-ip-cidrs"] {
		ps, err := config.ParsePrefixes("external-ip-cidrs", f.externalIPCIDRs)
		if err != nil {
			return err
		}
		cidrs = nil
		for _, p := range ps {
			cidrs = append(cidrs, p.String())
		}
	}
	identity := f.identity
	if identity == "" {
		identity = os.Getenv("POD_NAME")
	}
	if identity == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("no --identity, no $POD_NAME and no hostname: %w", err)
		}
		identity = h
	}
	identity = strings.TrimSpace(identity)

	// /healthz: ok until the hook exists, then the hook's leader-election
	// watchdog (a leader that stopped renewing is restarted by the
	// liveness probe). /metrics on the same port: the leader's pool
	// allocations and webhook results, which no node agent has in a split
	// install. Served with the agent's server limits, and bound again
	// every few seconds while the port is taken.
	var healthy atomic.Pointer[func() error]
	reg := prometheus.NewRegistry()
	metrics := dataplane.NewMetrics(reg)
	if f.healthzAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
			if check := healthy.Load(); check != nil {
				if err := (*check)(); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			_, _ = io.WriteString(w, "ok")
		})
		go dataplane.ServeRetrying(ctx, log, "healthz", f.healthzAddr, 0, func(ctx context.Context, ln net.Listener) error {
			return dataplane.ServeHandler(ctx, ln, mux, "healthz")
		}, nil)
	}

	rc, err := clientcmd.BuildConfigFromFlags(f.master, f.kubeconfig)
	if err != nil {
		return fmt.Errorf("API server configuration: %w", err)
	}
	rc.QPS, rc.Burst = float32(f.qps), f.burst
	rc.UserAgent = "onehop-controller/" + version
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	// With the node agents split off, the Services' problems are told
	// from here, once (reportServiceProblems).
	problemsDone := make(chan struct{})
	if separateController(ext) {
		pcfg := portal.Config{ServiceProxyName: proxyName, Limits: limits, ExternalIPCIDRs: []netip.Prefix{}}
		for _, c := range cidrs {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				return fmt.Errorf("external IP CIDR %q: %w", c, err)
			}
			pcfg.ExternalIPCIDRs = append(pcfg.ExternalIPCIDRs, p)
		}
		go func() {
			defer close(problemsDone)
			if err := reportServiceProblems(ctx, client, pcfg, log.With("component", "problems")); err != nil && ctx.Err() == nil {
				log.Error("reporting the Services' problems stopped", "err", err)
			}
		}()
	} else {
		close(problemsDone)
	}
	defer func() { <-problemsDone }()

	if len(ext) == 0 || string(ext) == "null" {
		log.Info("onehop controller: the config has no external section; nothing to do", "config", f.config)
		<-ctx.Done()
		return nil
	}
	ec, err := extconfig.Decode(ext)
	if err != nil {
		return fmt.Errorf("%s: external section: %w", f.config, err)
	}
	if len(ec.ExternalIPCIDRs) == 0 {
		ec.ExternalIPCIDRs = cidrs
	}
	if !ec.SeparateController {
		log.Warn("onehop controller: external.separateController is off, so the node agents also campaign for the allocator Lease; set it so that they write nothing cluster-wide")
	}
	dyn, err := dynamic.NewForConfig(rc) // the onehop.io custom resources (external.crds)
	if err != nil {
		return err
	}
	hook, err := external.NewController(ec, client, identity, log, external.WithDynamicClient(dyn),
		external.WithProviderHealth(nil, metrics))
	if err != nil {
		return fmt.Errorf("%s: external section: %w", f.config, err)
	}
	check := hook.Healthy
	healthy.Store(&check)
	log.Info("onehop controller starting", "version", version, "identity", identity)
	return hook.Run(ctx)
}
