// Command agent is onehop's per-node agent: run it in place of kube-proxy.
//
//	agent run        keep the kernel in step with Services and EndpointSlices
//	agent conntrack-setup set the conntrack sysctls of run's settings, and
//	                 exit (the DaemonSet's privileged init container)
//	agent controller the cloud hook's cluster-wide part (IP allocation,
//	                 Service status, webhook), leader-elected, as a Deployment
//	agent dump-rules show what the kernel holds, per Service port
//	agent trace      tell which way a packet goes through the kernel's rules
//	agent cleanup    remove everything onehop installed (with
//	                 --kube-proxy-leftovers: only kube-proxy's rules)
//	agent convert-metallb print onehop's resources for MetalLB's
//	agent version    print the version
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch args[0] {
	case "run":
		err = runCmd(ctx, args[1:], stderr)
	case "conntrack-setup":
		err = conntrackSetupCmd(ctx, args[1:], stderr)
	case "controller":
		err = controllerCmd(ctx, args[1:], stderr)
	case "dump-rules":
		err = dumpCmd(ctx, args[1:], stdout, stderr)
	case "trace":
		err = traceCmd(ctx, args[1:], stdout, stderr)
	case "cleanup":
		err = cleanupCmd(ctx, args[1:], stdout, stderr)
	case "convert-metallb":
		err = convertMetalLBCmd(args[1:], os.Stdin, stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "onehop agent %s\n", version)
	case "help", "-h", "--help":
		usage(stdout)
	default:
		fmt.Fprintf(stderr, "agent: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "agent %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: agent <command> [flags]

commands:
  run          program the kernel from Services, EndpointSlices and this Node
  conntrack-setup  set the conntrack sysctls of run's --config and --conntrack-* flags, and exit
               (the DaemonSet runs it privileged, before the unprivileged agent)
  controller   the cloud hook's cluster-wide part: LoadBalancer IPs, Service status, webhook
  dump-rules   print the kernel's onehop state per Service port (-o table|json|nft)
  trace        tell which way a new connection goes through the kernel's rules: the
               Service it matches, masquerade, policies, endpoints and their weights,
               affinity, conntrack (--from ADDR|node, --from-pod NS/NAME, --to ADDR:PORT/PROTO,
               -o text|json)
  cleanup      remove everything onehop installed, and nothing else
  convert-metallb  print onehop's resources for MetalLB's (-f FILE, --strict)
  version      print the version

Run "agent <command> -h" for a command's flags.
`)
}

func newLogger(w io.Writer, verbosity int, format string) *slog.Logger {
	level := slog.LevelInfo
	if verbosity >= 2 {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
