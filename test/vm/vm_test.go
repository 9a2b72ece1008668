package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// GuestPackages are the packages whose tests run inside the VM, relative to
// the module root; the guest binary is named after the last element. A
// ":regexp" suffix runs only the matching tests of that package: the nft
// package's SCTP test runs here because the host kernel has no SCTP.
var GuestPackages = []string{"./ipvs", "./nft:TestSCTP"}

// EnvPackages names the environment variable that replaces GuestPackages
// for one run (comma separated, same syntax), e.g.
// ONEHOP_VM_PACKAGES=./test/difftest:TestDifferentialIPVS.
const EnvPackages = "ONEHOP_VM_PACKAGES"

// guestPackages returns $ONEHOP_VM_PACKAGES, or GuestPackages.
func guestPackages() []string {
	if s := os.Getenv(EnvPackages); s != "" {
		return strings.Split(s, ",")
	}
	return GuestPackages
}

const qemu = "qemu-system-x86_64"

func TestIPVSInVM(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM (about a minute under TCG); skipped with -short")
	}
	if os.Getuid() != 0 {
		t.Skip("needs root: installs qemu/busybox/ipvsadm with apt-get, extracts a kernel .deb and boots it")
	}
	if os.Getenv("ONEHOP_VM") != "" {
		t.Skip("already inside the test VM")
	}
	// Stop (and say where) before go test's own -timeout panics. A
	// selected package may ask for longer.
	packages := guestPackages()
	length := 15 * time.Minute
	for _, spec := range packages {
		pkg, _, _ := strings.Cut(spec, ":")
		length = max(length, guestNeeds[pkg].timeout)
	}
	deadline := time.Now().Add(length)
	if d, ok := t.Deadline(); ok && d.Add(-20*time.Second).Before(deadline) {
		deadline = d.Add(-20 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	root := moduleRoot(t)
	trackInputs(t, root)
	work := t.TempDir()
	start := time.Now()

	// 1. Static test binaries: the guest has no libc for them.
	var bins []string
	var perBinaryRun []string
	// What the selected packages need beyond their test binaries.
	memory, extraEnv, modules := guestMemoryMB, []string(nil), []string(nil)
	for _, spec := range packages {
		pkg, _, _ := strings.Cut(spec, ":")
		need, ok := guestNeeds[pkg]
		if !ok {
			continue
		}
		files, err := need.files(ctx, root, work)
		if err != nil {
			t.Fatalf("files %s needs in the guest: %v", pkg, err)
		}
		for _, guestPath := range slices.Sorted(maps.Keys(files)) {
			bins = append(bins, guestPath+"="+files[guestPath])
		}
		extraEnv = append(extraEnv, need.env...)
		modules = append(modules, need.modules...)
		memory = max(memory, need.memoryMB)
	}
	for _, spec := range packages {
		pkg, run, _ := strings.Cut(spec, ":")
		name := filepath.Base(pkg) + ".test"
		if run != "" {
			perBinaryRun = append(perBinaryRun, "onehop.run."+name+"="+run)
		}
		out := filepath.Join(work, name)
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-trimpath", "-o", out, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s for the guest (a cold build compiles k8s.io with CGO_ENABLED=0; give go test a -timeout of 30m): %v (%v)\n%s", pkg, err, ctx.Err(), b)
		}
		if _, err := os.Stat(out); err != nil {
			t.Fatalf("%s has no tests to run in the guest", pkg)
		}
		bins = append(bins, name+"="+out)
	}
	built := time.Now()

	// 2. Kernel (cached) and initramfs; image.sh installs missing host packages.
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(root, "test/vm/image.sh"), filepath.Join(work, "img")}, bins...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	imgErr := cmd.Run()
	if _, err := exec.LookPath(qemu); err != nil {
		msg := fmt.Sprintf("%s is not available and could not be installed (%v); image.sh said:\n%s", qemu, imgErr, stderr.String())
		if os.Getenv("ONEHOP_VM_REQUIRED") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if imgErr != nil {
		t.Fatalf("image.sh: %v\n%s", imgErr, stderr.String())
	}
	t.Logf("image: %s", strings.TrimSpace(stderr.String()))
	paths := map[string]string{}
	for _, l := range strings.Split(stdout.String(), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok {
			paths[k] = v
		}
	}
	if paths["kernel"] == "" || paths["initrd"] == "" {
		t.Fatalf("image.sh printed no kernel/initrd: %q", stdout.String())
	}
	imaged := time.Now()

	// 3. Boot. No NIC: nothing the guest does can leave the VM.
	// Each guest binary may use what is left of the deadline (init.sh's
	// 400 s default is too short on a loaded machine under emulation).
	guestTimeout := time.Until(deadline) - 30*time.Second
	if guestTimeout < time.Minute {
		guestTimeout = time.Minute
	}
	appendLine := fmt.Sprintf("console=ttyS0 panic=-1 quiet onehop.timeout=%ds ", int(guestTimeout.Seconds())) + strings.Join(perBinaryRun, " ")
	if env := strings.Join(append(extraEnv, guestEnv(os.Environ())...), ","); env != "" {
		appendLine += " onehop.env=" + env
	}
	if len(modules) > 0 {
		appendLine += " onehop.modules=" + strings.Join(modules, ",")
	}
	if r := os.Getenv("ONEHOP_VM_RUN"); r != "" {
		if strings.ContainsAny(r, " \t") {
			t.Fatalf("ONEHOP_VM_RUN must not contain spaces: %q", r)
		}
		appendLine += " onehop.run=" + r
	}
	base := []string{"-smp", "2", "-m", fmt.Sprintf("%dM", memory), "-nographic", "-no-reboot", "-nic", "none",
		"-kernel", paths["kernel"], "-initrd", paths["initrd"], "-append", appendLine}
	accels := [][]string{{"-accel", "tcg"}}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil && os.Getenv("ONEHOP_VM_ACCEL") != "tcg" {
		f.Close()
		// KVM first (tcg if it cannot start). A KVM that starts but
		// cannot run the guest (a nested host that does not emulate an
		// instruction the guest kernel uses, or refuses an MSR) is
		// stopped at its first error, and the guest boots again under
		// tcg alone.
		accels[0] = []string{"-accel", "kvm", "-accel", "tcg"}
		accels = append(accels, []string{"-accel", "tcg"})
	}
	var console []string
	var qerr, qctxErr error
	for i, accel := range accels {
		var kvmFailed bool
		console, qerr, qctxErr, kvmFailed = bootGuest(ctx, t, qemu, append(slices.Clone(accel), base...), imaged)
		if _, err := parseConsole(console); err == nil || i == len(accels)-1 || ctx.Err() != nil {
			break // the guest finished (its tests passed or not), or no time is left
		}
		if !kvmFailed && qerr == nil {
			break // the guest stopped on its own without its marker: not KVM's doing
		}
		t.Logf("KVM could not run the guest (%v); booting it again under tcg", qerr)
	}
	booted := time.Now()
	t.Logf("timing: build %.1fs, image %.1fs, vm %.1fs, total %.1fs",
		built.Sub(start).Seconds(), imaged.Sub(built).Seconds(), booted.Sub(imaged).Seconds(), booted.Sub(start).Seconds())

	res, err := parseConsole(console)
	if err != nil {
		t.Fatalf("guest did not finish (qemu: %v, ctx: %v): %v", qerr, qctxErr, err)
	}
	for _, spec := range packages {
		pkg, _, _ := strings.Cut(spec, ":")
		name := filepath.Base(pkg) + ".test"
		r, ok := res[name]
		switch {
		case !ok:
			t.Errorf("%s did not run in the guest", name)
		case r.rc != 0:
			t.Errorf("%s failed in the guest (exit %d): %s\nfailures:\n%s", name, r.rc, r.summary(), strings.Join(r.failed, "\n"))
		case r.passed == 0:
			t.Errorf("%s ran no test in the guest: %s", name, r.summary())
		default:
			t.Logf("%s in the guest: %s", name, r.summary())
		}
	}
}

// guestEnv is the host's ONEHOP_CHURN_* variables (the churn tests' seed
// and length) and ONEHOP_DIFFTEST_* (the differential tester's seed and
// number of cases), for init.sh's onehop.env: K=V,K=V. Values with spaces
// or commas cannot travel on the kernel command line and are left out.
func guestEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		if (strings.HasPrefix(kv, "ONEHOP_CHURN_") || strings.HasPrefix(kv, "ONEHOP_DIFFTEST_")) && !strings.ContainsAny(kv, " \t,\"") {
			out = append(out, kv)
		}
	}
	return out
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[a-zA-Z]|\x1bc`)

type result struct {
	rc              int
	passed, skipped int
	failed          []string
}

func (r result) summary() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped", r.passed, len(r.failed), r.skipped)
}

// parseConsole reads the markers init.sh prints around each test binary.
func parseConsole(lines []string) (map[string]result, error) {
	res := map[string]result{}
	cur := ""
	var r result
	done := false
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "ONEHOP-VM-BEGIN "):
			cur, r = strings.TrimSpace(strings.TrimPrefix(l, "ONEHOP-VM-BEGIN ")), result{}
		case strings.HasPrefix(l, "ONEHOP-VM-END "):
			var name string
			if _, err := fmt.Sscanf(l, "ONEHOP-VM-END %s rc=%d", &name, &r.rc); err != nil {
				return nil, fmt.Errorf("bad end marker %q: %v", l, err)
			}
			res[name] = r
			cur = ""
		case strings.HasPrefix(l, "ONEHOP-VM-DONE"):
			done = true
		case cur != "":
			t := strings.TrimSpace(l)
			switch {
			case strings.HasPrefix(t, "--- PASS"):
				r.passed++
			case strings.HasPrefix(t, "--- SKIP"):
				r.skipped++
			case strings.HasPrefix(t, "--- FAIL"):
				r.failed = append(r.failed, t)
			}
		}
	}
	if cur != "" {
		return res, fmt.Errorf("%s started but never finished (crash or timeout)", cur)
	}
	if !done {
		return res, errors.New("no ONEHOP-VM-DONE marker on the console")
	}
	return res, nil
}

// trackInputs stats every source file of the module: go test caches a
// test's result keyed by the files it looked at, and this test's real
// inputs are the guest packages (built by a child go command, invisible to
// the cache) and the image scripts.
func trackInputs(t *testing.T, root string) {
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") || strings.HasSuffix(p, ".sh") || strings.HasSuffix(p, ".golden") ||
			d.Name() == "go.mod" || d.Name() == "go.sum" {
			_, err = os.Stat(p)
		}
		return err
	})
	if err != nil {
		t.Fatalf("listing the module's sources: %v", err)
	}
}

func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no go.mod above %s", dir)
		}
	}
}

// bootGuest runs qemu with args until the guest powers off, logging its
// console, and returns the console's lines. kvmFailed reports that KVM
// stopped the guest with an internal error: qemu then pauses rather than
// exits, so it is killed at once.
func bootGuest(ctx context.Context, t *testing.T, qemu string, args []string, since time.Time) (console []string, qerr, ctxErr error, kvmFailed bool) {
	qctx, qcancel := context.WithCancel(ctx)
	defer qcancel()
	q := exec.CommandContext(qctx, qemu, args...)
	q.Stdin = nil
	pipe, err := q.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	q.Stderr = q.Stdout
	if err := q.Start(); err != nil {
		t.Skipf("%s cannot start: %v", qemu, err)
	}
	sc := bufio.NewScanner(pipe)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := strings.TrimRight(ansi.ReplaceAllString(sc.Text(), ""), "\r")
		console = append(console, l)
		t.Logf("[guest %5.1fs] %s", time.Since(since).Seconds(), l)
		if strings.Contains(l, "KVM internal error") && !kvmFailed {
			kvmFailed = true
			go func() { time.Sleep(time.Second); qcancel() }() // the register dump first
		}
	}
	qerr = q.Wait()
	return console, qerr, qctx.Err(), kvmFailed
}
