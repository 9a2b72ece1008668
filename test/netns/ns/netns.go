package ns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Dir is where iproute2 bind-mounts named network namespaces.
const Dir = "/run/netns"

// Prefix starts the name of every namespace this harness creates. The owner's
// pid follows it, so Sweep can tell which namespaces are orphans.
const Prefix = "oh"

// Available reports why network namespaces cannot be used here, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("network namespaces need root (run the tests as root, e.g. sudo -E go test ./test/...)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("the ip command (iproute2) is missing: run hack/ci-deps.sh or apt-get install iproute2")
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip netns is unavailable: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// RunID returns a short unique token for namespace names of one run: the
// owner's pid (for Sweep) and random hex, e.g. "oh1234-9f3a".
func RunID() string {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s%d-%s", Prefix, os.Getpid(), hex.EncodeToString(b))
}

// Create makes a new named network namespace with loopback up.
func Create(ctx context.Context, name string) error {
	if err := IP(ctx, "", "netns", "add", name); err != nil {
		return err
	}
	return IP(ctx, name, "link", "set", "lo", "up")
}

// Delete kills every process still in the namespace and removes it. A
// namespace that does not exist is not an error.
func Delete(ctx context.Context, name string) error {
	if _, err := os.Stat(filepath.Join(Dir, name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	KillAll(ctx, name)
	return IP(ctx, "", "netns", "del", name)
}

// KillAll SIGKILLs every process whose network namespace is name.
func KillAll(ctx context.Context, name string) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "pids", name).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 && pid != os.Getpid() {
			if p, err := os.FindProcess(pid); err == nil {
				_ = p.Kill()
			}
		}
	}
}

// IP runs `ip [-n name] args...` and returns its error with its output.
func IP(ctx context.Context, name string, args ...string) error {
	if name != "" {
		args = append([]string{"-n", name}, args...)
	}
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Exec runs a short command inside the namespace and returns its combined
// output.
func Exec(ctx context.Context, name string, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", name}, argv...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in netns %s: %s: %v: %s", name, strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Sysctl sets key=value inside the namespace, e.g. Sysctl(ctx, n,
// "net.ipv4.ip_forward", "1").
func Sysctl(name, key, value string) error {
	return Do(name, func() error {
		p := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
		return os.WriteFile(p, []byte(value), 0o644)
	})
}
