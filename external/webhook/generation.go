package webhook

import "fmt"

// A generation is a leadership term and a counter within that term:
// term<<32 | count. Terms are recorded in the apiserver by the caller of
// Notifier.Lead and only ever grow, so every generation a new leader sends
// is above every generation an earlier leader sent, and within a term the
// counter grows with every message. Generations stay below 2^53 (exact as
// a JavaScript number) for the first 2^21 terms.
const (
	termShift = 32
	// maxTerm is the largest term Lead accepts.
	maxTerm = 1<<(64-termShift) - 1
	// maxCount is the last counter value of a term.
	maxCount = 1<<termShift - 1
)

// Generation returns the generation of the count-th message of term.
func Generation(term, count uint64) uint64 { return term<<termShift | count }

// TermOf returns the leadership term a generation belongs to.
func TermOf(gen uint64) uint64 { return gen >> termShift }

func checkTerm(term, previous uint64) error {
	switch {
	case term == 0 || term > maxTerm:
		return fmt.Errorf("webhook: term %d outside 1..%d", term, uint64(maxTerm))
	case term <= previous:
		return fmt.Errorf("webhook: term %d is not above the previous term %d", term, previous)
	}
	return nil
}
