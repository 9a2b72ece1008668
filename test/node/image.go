package node

import (
	"archive/tar"
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ImageSpec says what goes into a locally built image: one layer of files,
// an entrypoint, no registry involved.
type ImageSpec struct {
	// Ref names the image, as pods and containerd refer to it.
	Ref string
	// Files maps a path in the image to the host file it is copied from
	// (mode and content; symlinks are followed).
	Files map[string]string
	// Links maps a path in the image to a symlink target.
	Links map[string]string
	// Dirs are empty directories to create (mode 1777 for /tmp, else 0755).
	Dirs       []string
	Entrypoint []string
	Cmd        []string
}

// WriteImage builds spec as a single-layer image and writes it to path as a
// tarball that `ctr images import` reads.
func WriteImage(spec ImageSpec, path string) error {
	ref, err := name.ParseReference(spec.Ref)
	if err != nil {
		return fmt.Errorf("image %q: %w", spec.Ref, err)
	}
	layerPath := path + ".layer"
	if err := writeLayer(spec, layerPath); err != nil {
		return err
	}
	defer os.Remove(layerPath)
	layer, err := tarball.LayerFromFile(layerPath)
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config = v1.Config{
		Entrypoint: spec.Entrypoint,
		Cmd:        spec.Cmd,
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	return tarball.WriteToFile(path, ref, img)
}

// writeLayer writes the layer tar: directories first, parents before
// children, then files and links, in a stable order.
func writeLayer(spec ImageSpec, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	dirs := map[string]bool{}
	addDir := func(d string, mode int64) error { return addDirMode(tw, dirs, d, mode) }
	for _, d := range spec.Dirs {
		mode := int64(0o755)
		if strings.Trim(d, "/") == "tmp" {
			mode = 0o1777
		}
		if err := addDir(d, mode); err != nil {
			return err
		}
	}
	for _, p := range sortedKeys(spec.Files) {
		if err := addDir(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := addFile(tw, strings.TrimPrefix(p, "/"), spec.Files[p]); err != nil {
			return err
		}
	}
	for _, p := range sortedKeys(spec.Links) {
		if err := addDir(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(p, "/"), Linkname: spec.Links[p], Mode: 0o777}); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// addDirMode writes directory d, after its parents (0755), once.
func addDirMode(tw *tar.Writer, dirs map[string]bool, d string, mode int64) error {
	d = strings.Trim(d, "/")
	if d == "" || d == "." || dirs[d] {
		return nil
	}
	if parent := filepath.Dir(d); parent != "." {
		if err := addDirMode(tw, dirs, parent, 0o755); err != nil {
			return err
		}
	}
	dirs[d] = true
	return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode})
}

func addFile(tw *tar.Writer, name, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(st.Mode().Perm()), Size: st.Size()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, in)
	return err
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// WithHostPrograms adds host programs (found on PATH) to spec at the same
// paths, with every shared library ldd lists for them, so that a test
// image has a userland from the machine's own Debian packages.
func WithHostPrograms(spec *ImageSpec, programs ...string) error {
	if spec.Files == nil {
		spec.Files = map[string]string{}
	}
	for _, prog := range programs {
		p, err := exec.LookPath(prog)
		if err != nil {
			return fmt.Errorf("image %s: host program %s: %w", spec.Ref, prog, err)
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return err
		}
		spec.Files[canonicalDir(p)] = real
		libs, err := sharedLibraries(real)
		if err != nil {
			return fmt.Errorf("image %s: libraries of %s: %w", spec.Ref, p, err)
		}
		for _, lib := range libs {
			r, err := filepath.EvalSymlinks(lib)
			if err != nil {
				return err
			}
			spec.Files[canonicalDir(lib)] = r
		}
	}
	if spec.Links == nil {
		spec.Links = map[string]string{}
	}
	// Debian's merged /usr: the files sit under /usr, the old paths link.
	for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
		spec.Links["/"+d] = "usr/" + d
	}
	return nil
}

// canonicalDir resolves the symlinks of p's directory (not of p itself):
// /lib/x86_64-linux-gnu/libc.so.6 is /usr/lib/x86_64-linux-gnu/libc.so.6
// on a merged-/usr system.
func canonicalDir(p string) string {
	dir, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil {
		return p
	}
	return filepath.Join(dir, filepath.Base(p))
}

// sharedLibraries lists the absolute library paths ldd prints for bin
// (none for a static binary).
func sharedLibraries(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", bin, err, out)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		for _, field := range strings.Fields(line) {
			if strings.HasPrefix(field, "/") {
				libs = append(libs, field)
			}
		}
	}
	return libs, nil
}
