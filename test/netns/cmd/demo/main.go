// Command demo shows onehop end to end on a namespace cluster (package
// test/netns): a real kube-apiserver, two nodes running the agent, a
// Deployment-like set of pods behind a LoadBalancer Service, and an external
// client whose request lands on a pod, source address intact, through one
// DNAT. Run it through `make demo` (hack/demo.sh), as root.
//
//	demo up     bring the cluster up, show the request, tear down
//	            (DEMO_HOLD=1 keeps it up until Ctrl-C or `demo down`)
//	demo down   stop a held demo and delete namespaces left by any run
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

const pidFile = "/run/onehop-demo.pid"

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cmd := "up"
	if len(os.Args) > 1 {
		cmd = os.Args[1]
	}
	if err := nsutil.Available(); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		fmt.Fprintln(os.Stderr, "demo: it needs root because it creates network namespaces, veth pairs, bridges and nftables tables (all inside namespaces of its own, nothing in the host's): run `sudo make demo`.")
		os.Exit(2)
	}
	var err error
	switch cmd {
	case "up":
		err = up(log, os.Getenv("DEMO_HOLD") != "")
	case "down":
		err = down(log)
	default:
		err = fmt.Errorf("unknown command %q (want up or down)", cmd)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func up(log *slog.Logger, hold bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidFile)

	step("Bringing up a namespace cluster: etcd + kube-apiserver, a router, an external client, 2 nodes running the agent, 2 pods per node")
	began := time.Now()
	c, err := netns.New(ctx, netns.Config{Log: log, PodPrefix: "hello"})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("   up in %v (namespaces %s-*, apiserver %s)\n", time.Since(began).Round(time.Millisecond), c.ID, c.CP.URL)

	show, err := runDemo(ctx, c)
	if err != nil {
		return err
	}
	fmt.Println(show)

	if hold {
		step("Holding the cluster (DEMO_HOLD). Stop with Ctrl-C or `make demo-down`.")
		fmt.Printf("   e.g. ip netns exec %s nft list table inet onehop\n", c.Nodes[0].Netns)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
	}
	step("Tearing down")
	return nil
}

func down(log *slog.Logger) error {
	if b, err := os.ReadFile(pidFile); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			if p, err := os.FindProcess(pid); err == nil && p.Signal(syscall.SIGTERM) == nil {
				fmt.Printf("demo: stopping demo process %d\n", pid)
				for i := 0; i < 100 && p.Signal(syscall.Signal(0)) == nil; i++ {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
	}
	nsutil.Sweep(context.Background(), log)
	fmt.Println("demo: down (no onehop demo namespaces left without an owner)")
	return nil
}

func step(s string) { fmt.Printf("\n==> %s\n", s) }
