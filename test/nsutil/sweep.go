package nsutil

import (
	"context"
	"log/slog"
	"os"
)

// Sweep deletes namespaces created by these helpers whose owning process no
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
