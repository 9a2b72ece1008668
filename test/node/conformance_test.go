package node_test

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/test/node"
	"github.com/onehop/onehop/test/nsutil"
)

// EnvConformance picks what TestConformance runs of upstream Kubernetes's
// e2e suite: "all" (the default: every test of Services and the proxy that
// this machine can run, serviceFocus), "conformance" (the [Conformance]
// tests of `[sig-network] Services` alone), "off", or any other text: a
// regular expression the test names must match too (one test, to look at
// it).
const EnvConformance = "ONEHOP_CONFORMANCE"

// EnvConformanceProcs is how many ginkgo processes run the suite side by
// side (default 4: the tests mostly wait on pods and timeouts, not CPU).
// [Serial] tests run alone after the others, as ginkgo does.
const EnvConformanceProcs = "ONEHOP_CONFORMANCE_PROCS"

// serviceFocus is every upstream test of Services and the proxy: the
// Services, Conntrack, EndpointSlice(Mirroring) and KubeProxy suites and
// the Services part of Networking's granular checks.
const serviceFocus = `\[sig-network\] (Services|Conntrack|EndpointSlice|KubeProxy|Networking Granular Checks: Services)`

// EnvConformanceProxy runs the suite with kube-proxy (built from its Go
// module, nftables mode) in onehop's place, for comparison: "kube-proxy".
const EnvConformanceProxy = "ONEHOP_CONFORMANCE_PROXY"

// conformanceSkips are the tests of serviceFocus that do not run here, and
// why; they are skipped whichever the proxy. TestConformance fails on any
// other failure.
var conformanceSkips = []struct{ pattern, why string }{
	{`\[Disruptive\]`, "restarts the API server or kube-proxy over SSH, which this harness does not offer"},
	{`SCTP`, "the host kernel has no SCTP (the IPVS VM covers onehop's SCTP)"},
}

// conformanceExternalIPs is where the suite's externalIPs test puts its
// Service ("via ExternalIP when the external IP is not assigned to a
// node"). onehop refuses spec.externalIPs outside externalIPCIDRs, none by
// default (README: where onehop deliberately differs); the harness allows
// this one, as an operator who uses externalIPs would.
const conformanceExternalIPs = "203.0.113.250/32"

// allowExternalIPs adds externalIPCIDRs to config.conf's
// OnehopConfiguration.
func allowExternalIPs(conf string) (string, error) {
	const kind = "kind: OnehopConfiguration\n"
	if !strings.Contains(conf, kind) || strings.Contains(conf, "\nexternalIPCIDRs:") {
		return "", fmt.Errorf("want one OnehopConfiguration document without externalIPCIDRs:\n%s", conf)
	}
	return strings.Replace(conf, kind, kind+"externalIPCIDRs: ["+conformanceExternalIPs+"]\n", 1), nil
}

// Upstream Kubernetes's own Service tests (e2e.test built from
// k8s.io/kubernetes at the apiserver's version) against two real nodes
// running onehop's shipped DaemonSet and CoreDNS.
func TestConformance(t *testing.T) {
	mode := os.Getenv(EnvConformance)
	if mode == "" {
		mode = "all"
	}
	procs := 4
	if v := os.Getenv(EnvConformanceProcs); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a number of processes", EnvConformanceProcs, v)
		}
		procs = n
	}
	if mode == "off" {
		t.Skipf("skipping: %s=off", EnvConformance)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 75*time.Minute)
	defer cancel()
	bin, err := node.ConformanceBinaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	images := []string{filepath.Join(dir, "agnhost.tar"), filepath.Join(dir, "agent.tar"), filepath.Join(dir, "coredns.tar"), filepath.Join(dir, "kube-proxy.tar")}
	if err := node.BuildAgnhostImage(bin, images[0]); err != nil {
		t.Fatal(err)
	}
	if err := node.BuildAgentImage(ctx, "onehop.test/agent:v1", images[1]); err != nil {
		t.Fatal(err)
	}
	if err := node.BuildCoreDNSImage(bin, images[2]); err != nil {
		t.Fatal(err)
	}
	if err := node.BuildKubeProxyImage(bin, images[3]); err != nil {
		t.Fatal(err)
	}
	more, err := node.BuildE2EImages(bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	images = append(images, more...)
	c := node.Start(t, node.Options{Nodes: 2, Images: images})
	proxy := os.Getenv(EnvConformanceProxy)
	switch proxy {
	case "", "onehop":
		proxy = "onehop"
		if out, err := c.Kubectl(ctx, "apply", "-k", c.OverlayConfig(t, "deploy", "onehop.test/agent:v1", allowExternalIPs)); err != nil {
			t.Fatalf("kubectl apply -k: %v\n%s", err, out)
		}
		c.WaitDaemonSet(t, "kube-system", "onehop", 3*time.Minute)
		c.WaitDeployment(t, "kube-system", "onehop-controller", 3*time.Minute)
	case "kube-proxy":
		c.DeployKubeProxy(t)
	default:
		t.Fatalf("%s=%q: onehop or kube-proxy", EnvConformanceProxy, proxy)
	}
	c.DeployDNS(t)

	focus := serviceFocus
	switch mode {
	case "conformance":
		focus = `\[sig-network\] Services .*\[Conformance\]`
	case "all":
	default:
		focus += ".*" + mode
	}
	var skips []string
	for _, s := range conformanceSkips {
		skips = append(skips, s.pattern)
	}
	reports := filepath.Join(dir, "reports")
	logPath := filepath.Join(dir, "e2e.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	began := time.Now()
	// The ginkgo CLI runs e2e.test in procs processes, as upstream's
	// hack/ginkgo-e2e.sh does, and gives the [Serial] tests the cluster
	// alone at the end.
	cmd := nsutil.Command(ctx, c.Netns, filepath.Join(bin, "ginkgo"),
		"--procs="+strconv.Itoa(procs),
		"--focus="+focus,
		"--skip="+strings.Join(skips, "|"),
		"--timeout=70m",
		"--no-color",
		filepath.Join(bin, "e2e.test"), "--",
		"--kubeconfig="+c.CP.Kubeconfig,
		"--provider=skeleton",
		"--num-nodes=2",
		"--report-dir="+reports,
		"--e2e-output-dir="+filepath.Join(dir, "output"),
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	runErr := cmd.Run()
	took := time.Since(began).Round(time.Second)
	suite, err := readJUnit(reports)
	if err != nil {
		t.Fatalf("e2e.test (%v) left no report: %v; log %s:\n%s", runErr, err, logPath, tail(logPath, 6000))
	}
	// The report lists every spec of e2e.test; those outside the focus
	// are not counted as not run.
	inFocus := regexp.MustCompile(focus)
	var passed, failed, skipped []string
	for _, tc := range suite.Cases {
		switch {
		case tc.Skipped != nil:
			if inFocus.MatchString(tc.Name) {
				skipped = append(skipped, tc.Name+" ("+tc.Skipped.Message+")")
			}
		case tc.Failure != nil || tc.Error != nil:
			failed = append(failed, tc.Name)
		default:
			passed = append(passed, fmt.Sprintf("%s (%.0fs)", tc.Name, tc.Time))
		}
	}
	sort.Strings(passed)
	sort.Strings(failed)
	sort.Strings(skipped)
	t.Logf("upstream e2e, %s, with %s (%s, %d processes): %d passed, %d failed, %d not run in %v", focus, proxy, mode, procs, len(passed), len(failed), len(skipped), took)
	for _, n := range passed {
		t.Logf("  passed: %s", n)
	}
	for _, n := range skipped {
		t.Logf("  not run: %s", n)
	}
	for _, s := range conformanceSkips {
		t.Logf("  skipped %s: %s", s.pattern, s.why)
	}
	if len(failed) > 0 {
		for _, n := range failed {
			t.Errorf("  failed: %s", n)
		}
		t.Logf("e2e log %s (tail):\n%s", logPath, tail(logPath, 20000))
	}
	if len(passed) == 0 {
		t.Errorf("no test ran (e2e.test: %v); log:\n%s", runErr, tail(logPath, 6000))
	}
	if runErr != nil && len(failed) == 0 {
		t.Errorf("e2e.test: %v with no failed test; log:\n%s", runErr, tail(logPath, 6000))
	}
}

type junitSuite struct {
	Cases []struct {
		Name    string  `xml:"name,attr"`
		Time    float64 `xml:"time,attr"` // seconds
		Skipped *struct {
			Message string `xml:"message,attr"`
		} `xml:"skipped"`
		Failure *struct{} `xml:"failure"`
		Error   *struct{} `xml:"error"`
	} `xml:"testsuite>testcase"`
}

// readJUnit reads the JUnit report e2e.test writes into dir, without the
// suite's own setup entries.
func readJUnit(dir string) (*junitSuite, error) {
	files, err := filepath.Glob(filepath.Join(dir, "junit_*.xml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no junit_*.xml in %s (%v)", dir, err)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		return nil, err
	}
	var s junitSuite
	if err := xml.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	setup := regexp.MustCompile(`^\[(SynchronizedBeforeSuite|SynchronizedAfterSuite|BeforeSuite|AfterSuite|ReportAfterSuite|ReportBeforeSuite)\]`)
	out := s
	out.Cases = out.Cases[:0]
	for _, tc := range s.Cases {
		if !setup.MatchString(tc.Name) {
			out.Cases = append(out.Cases, tc)
		}
	}
	return &out, nil
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
