package nsutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Dir is where iproute2 bind-mounts named network namespaces.
const Dir = "/run/netns"

// Prefix starts the name of every namespace these helpers create. The
// owner's pid follows it, so Sweep can tell which namespaces are orphans.
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

// RequireRoot skips t, saying why, unless network namespaces are usable:
// root and `ip netns`.
func RequireRoot(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
}

// randHex returns n random bytes in hex.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Unique returns prefix followed by six random hex digits, short enough for
// interface names (at most 15 bytes with a prefix of up to 9).
func Unique(prefix string) string { return prefix + randHex(3) }

// RunID returns a short unique token for the namespace names of one run:
// the owner's pid (for Sweep) and random hex, e.g. "oh1234-9f3a".
func RunID() string {
	return fmt.Sprintf("%s%d-%s", Prefix, os.Getpid(), randHex(2))
}

// owner returns the pid in a name made by RunID or New, or 0.
func owner(name string) int {
	rest, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return 0
	}
	digits, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0
	}
	pid, err := strconv.Atoi(digits)
	if err != nil {
		return 0
	}
	return pid
}

// OwnerGone reports whether name was made by a process (RunID, New) that no
// longer exists.
func OwnerGone(name string) bool {
	pid := owner(name)
	if pid <= 0 || pid == os.Getpid() {
		return false
	}
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return os.IsNotExist(err)
}
