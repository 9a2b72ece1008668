package ipvs

import (
	"os"
	"os/exec"
	"testing"
)

// TestGuestTools checks, in the test VM only (it changes the root
// namespace's iptables), that the guest's iptables variant accepts every
// match and target the backend writes (xt_ipvs, MARK, MASQUERADE) for both
// families, and prints them in the canonical form plan.go writes.
func TestGuestTools(t *testing.T) {
	if os.Getenv("ONEHOP_VM") == "" {
		t.Skip("runs in the test VM (go test ./test/vm): it changes the root namespace's iptables")
	}
	for _, c := range [][]string{
		{"iptables", "--version"},
		{"iptables", "-t", "nat", "-N", "ONEHOP-PROBE"},
		{"iptables", "-t", "nat", "-A", "ONEHOP-PROBE", "-m", "ipvs", "--ipvs", "--vdir", "ORIGINAL", "--vaddr", "10.96.0.1/32", "--vport", "80", "--vproto", "6", "-m", "comment", "--comment", "a/b:c/tcp/ipv4", "-j", "MARK", "--set-xmark", "0x4000/0x4000"},
		{"iptables", "-t", "nat", "-A", "ONEHOP-PROBE", "-m", "ipvs", "!", "--ipvs", "-j", "RETURN"},
		{"iptables", "-t", "nat", "-A", "ONEHOP-PROBE", "-m", "mark", "!", "--mark", "0x4000/0x4000", "-j", "RETURN"},
		{"iptables", "-t", "nat", "-A", "ONEHOP-PROBE", "-j", "MARK", "--xor-mark", "0x4000"},
		{"iptables", "-t", "nat", "-A", "ONEHOP-PROBE", "-j", "MASQUERADE"},
		{"iptables", "-t", "nat", "-A", "ONEHOP-PROBE", "-s", "10.0.0.0/8", "-j", "MARK", "--set-xmark", "0x0/0x4000"},
		{"iptables", "-t", "filter", "-A", "INPUT", "-d", "10.0.0.1/32", "-p", "tcp", "-m", "tcp", "--dport", "80", "-j", "DROP"},
		{"iptables", "-t", "nat", "-S", "ONEHOP-PROBE"},
		{"iptables", "-S", "INPUT"},
		{"ip6tables", "-t", "nat", "-N", "ONEHOP-PROBE"},
		{"ip6tables", "-t", "nat", "-A", "ONEHOP-PROBE", "-m", "ipvs", "--ipvs", "--vaddr", "fd00::1/128", "--vport", "80", "--vproto", "6", "-j", "MASQUERADE"},
		{"ip6tables", "-t", "nat", "-S", "ONEHOP-PROBE"},
		{"ipvsadm", "-Ln"},
		// Leave nothing behind.
		{"iptables", "-t", "filter", "-D", "INPUT", "-d", "10.0.0.1/32", "-p", "tcp", "-m", "tcp", "--dport", "80", "-j", "DROP"},
		{"iptables", "-t", "nat", "-F", "ONEHOP-PROBE"},
		{"iptables", "-t", "nat", "-X", "ONEHOP-PROBE"},
		{"ip6tables", "-t", "nat", "-F", "ONEHOP-PROBE"},
		{"ip6tables", "-t", "nat", "-X", "ONEHOP-PROBE"},
	} {
		out, err := exec.Command(c[0], c[1:]...).CombinedOutput()
		t.Logf("%v: %v\n%s", c, err, out)
		if err != nil {
			t.Errorf("%v: %v", c, err)
		}
	}
}
