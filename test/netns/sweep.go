package netns

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/onehop/onehop/test/nsutil"
)

// dirPrefix starts the name of a cluster's temp dir, followed by its run ID
// (which carries the owner's pid).
const dirPrefix = "onehop-e2e-"

// sweepDirs removes temp dirs of runs whose process is gone (killed before
// Close could run), as nsutil.Sweep does for their namespaces.
func sweepDirs(log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+nsutil.Prefix+"*"))
	for _, d := range dirs {
		id := strings.TrimPrefix(filepath.Base(d), dirPrefix)
		if nsutil.OwnerGone(id) {
			if err := os.RemoveAll(d); err == nil {
				log.Info("swept stale run dir", "dir", d)
			}
		}
	}
}
