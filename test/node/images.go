package node

import (
	"context"
	"path/filepath"
)

// AgnhostImage is the e2e suite's test image, under the name e2e.test asks
// for (k8s.io/kubernetes/test/utils/image), so that no pull is needed.
const AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"

// agnhostPrograms are what the e2e suite and the tests run inside agnhost
// pods besides agnhost itself (curl, nc, nslookup, a shell); the upstream
// image has them from Alpine, this one from the machine's Debian packages.
var agnhostPrograms = []string{"sh", "bash", "curl", "nc", "nslookup", "dig", "timeout", "sleep", "cat", "ls", "hostname", "ip", "echo", "date", "grep", "wget"}

// BuildAgnhostImage writes the agnhost image (agnhost from bin, see
// Binaries) to path.
func BuildAgnhostImage(bin, path string) error {
	spec := ImageSpec{
		Ref:        AgnhostImage,
		Files:      map[string]string{"/agnhost": filepath.Join(bin, "agnhost")},
		Links:      map[string]string{"/agnhost-2": "agnhost"},
		Dirs:       []string{"/tmp", "/uploads", "/etc", "/var/run"},
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
	}
	if err := WithHostPrograms(&spec, agnhostPrograms...); err != nil {
		return err
	}
	return WriteImage(spec, path)
}

// BuildAgentImage builds the agent (as `make build` does) and writes the
// image the Dockerfile's default target makes, /usr/local/bin/agent on an
// empty base, as ref to path.
func BuildAgentImage(ctx context.Context, ref, path string) error {
	bin := path + ".agent"
	if err := GoBuild(ctx, bin, "./cmd/agent", "-tags", "grpcnotrace", "-ldflags", "-s -w"); err != nil {
		return err
	}
	return WriteImage(ImageSpec{
		Ref:        ref,
		Files:      map[string]string{"/usr/local/bin/agent": bin},
		Dirs:       []string{"/tmp", "/etc"},
		Entrypoint: []string{"/usr/local/bin/agent"},
	}, path)
}
