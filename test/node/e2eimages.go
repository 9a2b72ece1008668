package node

import (
	"fmt"
	"path/filepath"
)

// The other images upstream's Services and proxy tests run, under the
// names e2e.test asks for (k8s.io/kubernetes/test/utils/image at the
// apiserver's version), so that no pull is needed.
const (
	// BusyBoxImage runs a shell: init containers that sleep, a client
	// that loops over nc.
	BusyBoxImage = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	// DistrolessIptablesImage is the privileged host-network pod that
	// reads the node's conntrack table (KubeProxy's CLOSE_WAIT test).
	DistrolessIptablesImage = "registry.k8s.io/build-image/distroless-iptables:v0.9.9"
	// RegressionIssue74839Image is the server that sends an out-of-window
	// TCP packet (Conntrack's invalid-state test, kubernetes #74839).
	RegressionIssue74839Image = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5"
)

// shellPrograms are a small userland for the images below, from the
// machine's Debian packages (the upstream images have them from BusyBox).
var shellPrograms = []string{"sh", "sleep", "echo", "cat", "grep", "test", "which", "nc", "ls", "date"}

// BuildE2EImages writes the images of the consts above into dir (bin holds
// regression-issue-74839, built by hack/controlplane.sh conformance) and
// returns their paths.
func BuildE2EImages(bin, dir string) ([]string, error) {
	specs := []ImageSpec{
		{Ref: BusyBoxImage, Dirs: []string{"/tmp", "/etc"}, Cmd: []string{"sh"}},
		{Ref: DistrolessIptablesImage, Dirs: []string{"/tmp", "/etc", "/run", "/var/run"}, Cmd: []string{"sh"}},
		{Ref: RegressionIssue74839Image, Dirs: []string{"/tmp"},
			Files:      map[string]string{"/regression-issue-74839": filepath.Join(bin, "regression-issue-74839")},
			Entrypoint: []string{"/regression-issue-74839"}},
	}
	progs := [][]string{shellPrograms, append([]string{"conntrack"}, shellPrograms...), nil}
	var paths []string
	for i, spec := range specs {
		if err := WithHostPrograms(&spec, progs[i]...); err != nil {
			return nil, err
		}
		if spec.Ref == DistrolessIptablesImage {
			if err := withIptables(&spec); err != nil {
				return nil, err
			}
		}
		path := filepath.Join(dir, fmt.Sprintf("e2e-image-%d.tar", i))
		if err := WriteImage(spec, path); err != nil {
			return nil, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}
