package hooktest

import "k8s.io/client-go/tools/record"

// Drain returns the events the fake recorder holds now.
func Drain(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}
