// Package procstat reads what a test measures of a running process from
// outside it: its memory and CPU time from /proc/<pid>, its open file
// descriptors, the machine's load average, and the Prometheus text a
// process serves on /metrics. It reads only; it imports nothing of onehop.
package procstat
