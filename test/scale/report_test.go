package scale

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// results are one run's figures.
type results struct {
	knobs
	load                         [2]string // at start and end
	create, converge             time.Duration
	createCPU                    float64
	mem                          map[string]float64 // /proc status
	metrics                      map[string]float64 // the agent's, once synced
	flips                        []time.Duration
	warm, cold                   time.Duration
	fullSync, coldFullSync       float64
	fullSyncCPU, coldFullSyncCPU float64 // the same syncs' CPU time
	requests, failed             int64
	firstFailure                 string
	kubeProxy                    kubeProxyResults
}

func (r *results) flipP50() time.Duration { return percentile(r.flips, 0.5) }
func (r *results) flipMax() time.Duration { return percentile(r.flips, 1) }

func mib(b float64) string { return fmt.Sprintf("%.0f MiB", b/(1<<20)) }

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }

// table is the run's figures in Markdown, with kube-proxy's beside them
// when it ran.
func (r *results) table() string {
	var b strings.Builder
	kp := r.kubeProxy
	fmt.Fprintf(&b, "### %d Services x %d endpoints (%s)\n\n", r.services, r.endpoints, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Machine: %d CPUs, load average %s at the start, %s at the end.\n\n", runtime.NumCPU(), r.load[0], r.load[1])
	if kp.ran {
		b.WriteString("| measure | onehop | kube-proxy (nftables, same objects, same machine) |\n|---|---:|---:|\n")
	} else {
		b.WriteString("| measure | onehop |\n|---|---:|\n")
	}
	row := func(k, v string, kpv ...string) {
		if !kp.ran {
			fmt.Fprintf(&b, "| %s | %s |\n", k, v)
			return
		}
		other := "-"
		if len(kpv) > 0 && kpv[0] != "" {
			other = kpv[0]
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", k, v, other)
	}
	kpConverge := ms(kp.converge)
	if !kp.caughtUp {
		kpConverge = "not within 20 min"
	}
	secs := func(v, n float64) string {
		if n == 0 {
			return ""
		}
		return fmt.Sprintf("%.0f ms (mean of %.0f)", v*1000, n)
	}
	if r.preload {
		row("writing the Services and EndpointSlices (before any agent ran)", ms(r.create))
		row("start until the Service created last is served (kube-proxy: in its table)", ms(r.converge), kpConverge)
		row("CPU from start until served", fmt.Sprintf("%.1f s", r.createCPU), fmt.Sprintf("%.1f s", kp.createCPU))
	} else {
		row("writing the Services and EndpointSlices", ms(r.create))
		row("last write until the Service created last is served (kube-proxy: in its table)", ms(r.converge), kpConverge)
		row("CPU while the objects were written and synced", fmt.Sprintf("%.1f s", r.createCPU), fmt.Sprintf("%.1f s", kp.createCPU))
	}
	row("full sync after a warm restart (own histogram; its CPU time)", fmt.Sprintf("%.0f ms (%.0f ms)", r.fullSync*1000, r.fullSyncCPU*1000))
	row("full sync after a cold restart (empty table; its CPU time)", fmt.Sprintf("%.0f ms (%.0f ms)", r.coldFullSync*1000, r.coldFullSyncCPU*1000))
	if kp.fullSyncs > 0 { // the metric is there in kube-proxy's iptables mode, not always in nftables mode
		row("its full syncs while the objects were written (own histogram)", "-", secs(kp.fullSync, kp.fullSyncs))
	}
	if kp.partialSyncs > 0 {
		row("its partial syncs while the objects were written (own histogram)", "-", secs(kp.partialSync, kp.partialSyncs))
	}
	row("warm restart: SIGKILL until synced and healthy", ms(r.warm))
	row("cold restart (rules removed): start until a Service answers", ms(r.cold))
	row(fmt.Sprintf("endpoint change until traffic follows, p50 / max of %d", len(r.flips)), ms(r.flipP50())+" / "+ms(r.flipMax()))
	row(fmt.Sprintf("resident memory %v after the last change: VmRSS (peak VmHWM)", settle), mib(r.mem["VmRSS"])+" ("+mib(r.mem["VmHWM"])+")",
		mib(kp.mem["VmRSS"])+" ("+mib(kp.mem["VmHWM"])+")")
	row("of which anonymous / the binary's pages (RssAnon / RssFile)", mib(r.mem["RssAnon"])+" / "+mib(r.mem["RssFile"]),
		mib(kp.mem["RssAnon"])+" / "+mib(kp.mem["RssFile"]))
	row("Go heap in use / heap obtained from the OS / stacks", mib(r.metrics["go_memstats_heap_inuse_bytes"])+" / "+
		mib(r.metrics["go_memstats_heap_sys_bytes"])+" / "+mib(r.metrics["go_memstats_stack_inuse_bytes"]))
	row("rules in the table", fmt.Sprintf("%.0f", r.metrics["onehop_rules"]))
	row("requests during flips and restarts (failed)", fmt.Sprintf("%d (%d)", r.requests, r.failed))
	return b.String()
}

// appendTo adds the table to the file at path.
func (r *results) appendTo(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString("\n" + r.table()); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
