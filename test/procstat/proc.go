package procstat

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Memory returns pid's memory figures from /proc/<pid>/status, in bytes,
// by field name: VmRSS (resident), VmHWM (its peak), RssAnon (heap, stacks,
// buffers), RssFile (the binary's pages), and every other field in kB.
func Memory(pid int) (map[string]float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || !strings.HasSuffix(v, " kB") {
			continue
		}
		if kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64); err == nil {
			out[name] = kb * 1024
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if _, ok := out["VmRSS"]; !ok {
		return nil, fmt.Errorf("/proc/%d/status has no VmRSS", pid)
	}
	return out, nil
}

// CPUSeconds is the user+system CPU time pid has used.
func CPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command (which may hold spaces) start at ") ";
	// utime and stime are fields 14 and 15 of stat(5), 12 and 13 from
	// there, in USER_HZ (100 on Linux).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return (utime + stime) / 100, nil
}

// FDs counts pid's open file descriptors (the entries of /proc/<pid>/fd).
func FDs(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	return len(ents), nil
}

// LoadAvg is the machine's 1, 5 and 15 minute load average, as
// /proc/loadavg writes them ("?" when it cannot be read).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
