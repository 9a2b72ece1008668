package ns

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// owner returns the pid in a name made by RunID, or 0.
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

// OwnerGone reports whether name was made from a RunID whose process no
// longer exists.
func OwnerGone(name string) bool {
	pid := owner(name)
	if pid <= 0 || pid == os.Getpid() {
		return false
	}
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return os.IsNotExist(err)
}

// Sweep deletes namespaces created by this harness whose owning process no
// longer exists (a test binary killed with SIGKILL or by a timeout), with the
// processes left inside them. Namespaces of live owners are left alone, so
// parallel test binaries do not disturb each other.
func Sweep(ctx context.Context, log *slog.Logger) {
	entries, err := os.ReadDir(Dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !OwnerGone(e.Name()) {
			continue
		}
		if err := Delete(ctx, e.Name()); err != nil {
			log.Warn("sweep stale netns", "netns", e.Name(), "err", err)
		} else {
			log.Info("swept stale netns", "netns", e.Name())
		}
	}
}
