package nft

import (
	"errors"
	"slices"
	"time"

	"github.com/google/nftables"
)

// The kernel dumps a set's elements in parts (netlink messages), and
// resumes each part by walking the set from its start and skipping as many
// elements as the parts before it held. A hash set rehashes in the
// background after it grew or shrank, into another order: a dump taken
// meanwhile holds some elements twice and misses as many others, with the
// right count. A full sync that read such a dump would delete the repeated
// elements as unwanted (and try to add again the missing ones), leaving
// Services out of the table; dump-rules would show a table that is not
// there. A dump that holds an element twice is therefore read again, and
// one that holds none twice is exact: it holds as many elements as the set
// (a walk that restarts on a resize only adds repeats), all different.

// dumpAttempts bounds the dumps of one set that hold an element twice; a
// rehash takes milliseconds, and the attempts wait a little longer each.
const dumpAttempts = 12

// errRepeats: every dump of a set held an element twice.
var errRepeats = errors.New("every dump held an element twice: the kernel kept rehashing the set while it was read")

// readElems returns what read returns, once it holds no element twice.
func readElems(read func() ([]nftables.SetElement, error)) ([]nftables.SetElement, error) {
	for attempt := 1; ; attempt++ {
		els, err := read()
		if err != nil || !repeatsElement(els) {
			return els, err
		}
		if attempt == dumpAttempts {
			return nil, errRepeats
		}
		time.Sleep(time.Duration(attempt) * time.Millisecond)
	}
}

// repeatsElement reports whether els holds an element (a key, and for an
// interval set whether it ends an interval) twice. It sorts the keys'
// hashes, one allocation: a full sync reads 100k elements, and a map of
// them cost twice the time.
func repeatsElement(els []nftables.SetElement) bool {
	hs := make([]uint64, len(els))
	for i := range els {
		hs[i] = elemHash(&els[i])
	}
	slices.Sort(hs)
	for i := 1; i < len(hs); i++ {
		if hs[i] == hs[i-1] {
			return repeatsElementExactly(els) // or two keys with one hash
		}
	}
	return false
}

func repeatsElementExactly(els []nftables.SetElement) bool {
	seen := make(map[string]bool, len(els))
	for i := range els {
		k := string(els[i].Key)
		if els[i].IntervalEnd {
			k += "\x00end"
		}
		if seen[k] {
			return true
		}
		seen[k] = true
	}
	return false
}

// elemHash is FNV-1a (64 bits) of e's key and end flag.
func elemHash(e *nftables.SetElement) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range e.Key {
		h ^= uint64(c)
		h *= 1099511628211
	}
	if e.IntervalEnd {
		h ^= 1
		h *= 1099511628211
	}
	return h
}
