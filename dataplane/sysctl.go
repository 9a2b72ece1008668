package dataplane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Sysctl is one kernel setting under /proc/sys that the node's
// configuration asks for, with the setting that asked, so that an error
// can name both.
type Sysctl struct {
	// Field names the configuration setting that wants this value, as the
	// user wrote it (for example "conntrack.tcpEstablishedTimeout").
	Field string
	// Name is the path under /proc/sys, with slashes:
	// "net/netfilter/nf_conntrack_max".
	Name  string
	Value int
	// OnlyRaise leaves a current value that is already larger alone, as
	// kube-proxy does for nf_conntrack_max.
	OnlyRaise bool
}

// Dotted is the sysctl's name as sysctl(8) prints it.
func (s Sysctl) Dotted() string { return strings.ReplaceAll(s.Name, "/", ".") }

// SysctlChange is a sysctl WriteSysctls changed.
type SysctlChange struct {
	Sysctl
	Old int
}

// WriteSysctls sets each sysctl under root (/proc/sys, or a copy of it in
// tests) whose current value differs from the wanted one (for OnlyRaise:
// is smaller). It goes on after a failure and returns what it changed and
// one error per sysctl it could not set, naming the setting, the sysctl
// and, when the kernel refused, why. The files are opened by the calling
// thread, so a thread switched into another network namespace sets that
// namespace's values.
func WriteSysctls(root string, list []Sysctl) ([]SysctlChange, error) {
	var changed []SysctlChange
	var errs []error
	for _, s := range list {
		path := filepath.Join(root, s.Name)
		cur, err := readIntFile(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: cannot read sysctl %s: %w%s", s.Field, s.Dotted(), err, sysctlHint(err)))
			continue
		}
		if cur == s.Value || (s.OnlyRaise && cur > s.Value) {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.Itoa(s.Value)), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("%s: cannot set sysctl %s to %d (it is %d): %w%s",
				s.Field, s.Dotted(), s.Value, cur, err, sysctlHint(err)))
			continue
		}
		changed = append(changed, SysctlChange{Sysctl: s, Old: cur})
	}
	return changed, errors.Join(errs...)
}

// sysctlHint explains the usual causes of err.
func sysctlHint(err error) string {
	switch {
	case errors.Is(err, syscall.EROFS):
		return " (/proc/sys is mounted read-only: the agent's container is not privileged)"
	case errors.Is(err, os.ErrPermission):
		return " (not permitted: the agent needs CAP_NET_ADMIN in the node's network namespace and a writable " +
			"/proc/sys; nf_conntrack_max can only be changed from the host's initial network namespace)"
	case errors.Is(err, os.ErrNotExist):
		return " (the kernel has no such sysctl: is the nf_conntrack module loaded?)"
	}
	return ""
}

// ConntrackHashsizeFile is the conntrack hash table's size parameter.
const ConntrackHashsizeFile = "/sys/module/nf_conntrack/parameters/hashsize"

// RaiseConntrackHashsize makes the conntrack hash table (file, normally
// ConntrackHashsizeFile) at least max/4 buckets, as kube-proxy does after
// raising nf_conntrack_max. It reports whether it wrote. The kernel only
// allows this from the initial network namespace, and a read-only /sys
// refuses it; the error says which.
func RaiseConntrackHashsize(file string, max int) (bool, error) {
	cur, err := readIntFile(file)
	if err != nil {
		return false, fmt.Errorf("cannot read %s: %w", file, err)
	}
	if cur >= max/4 {
		return false, nil
	}
	if err := os.WriteFile(file, []byte(strconv.Itoa(max/4)), 0o600); err != nil {
		hint := ""
		if errors.Is(err, syscall.EROFS) {
			hint = " (/sys is mounted read-only)"
		}
		return false, fmt.Errorf("cannot set %s to %d (it is %d): %w%s", file, max/4, cur, err, hint)
	}
	return true, nil
}

func readIntFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: not a number: %q", path, strings.TrimSpace(string(b)))
	}
	return n, nil
}
