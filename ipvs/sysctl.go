package ipvs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// sysctl is one setting the backend makes; doc.go says why each.
type sysctl struct {
	name  string // dotted, as sysctl(8) spells it
	value string
}

// sysctls returns the settings for a kernel of the given release.
func sysctls(release string) []sysctl {
	// conn_reuse_mode=1 reschedules a new connection that reuses the source
	// port of an old one (instead of sending it to the old, maybe removed,
	// destination). Before 5.9 it also delayed such connections by a second
	// when IPVS conntrack was on, so kube-proxy turned it off there.
	reuse := "1"
	if kernelBefore(release, 5, 9) {
		reuse = "0"
	}
	return []sysctl{
		{"net.ipv4.vs.conntrack", "1"},
		{"net.ipv4.vs.conn_reuse_mode", reuse},
		{"net.ipv4.vs.expire_nodest_conn", "1"},
		{"net.ipv4.vs.expire_quiescent_template", "1"},
		{"net.ipv4.conf.all.arp_ignore", "1"},
		{"net.ipv4.conf.all.arp_announce", "2"},
	}
}

func setSysctls() error {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		return err
	}
	var rel []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		rel = append(rel, byte(c))
	}
	for _, s := range sysctls(string(rel)) {
		p := filepath.Join("/proc/sys", strings.ReplaceAll(s.name, ".", "/"))
		if cur, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(cur)) == s.value {
			continue
		}
		if err := os.WriteFile(p, []byte(s.value), 0o644); err != nil {
			return fmt.Errorf("ipvs: sysctl %s=%s: %w", s.name, s.value, err)
		}
	}
	return nil
}

// kernelBefore reports whether release (uname -r) is older than major.minor.
func kernelBefore(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return false
	}
	return ma < major || (ma == major && mi < minor)
}
