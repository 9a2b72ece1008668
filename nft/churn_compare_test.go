package nft

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/onehop/onehop/portal"
)

// Comparing the table incremental syncs left with a fresh full sync's, across
// processes.

// Normalising a table for comparison across processes.
var (
	churnCounter = regexp.MustCompile(`counter packets \d+ bytes \d+`)
	churnChainID = regexp.MustCompile(`numgen random mod 1 offset \d+`)
	churnShard   = regexp.MustCompile(`@endpoints([46])-\d+`)
)

// churnNormal prints the table with what differs between two processes
// programming the same state taken out: chain ids and endpoint-map shards
// are replaced by the endpoints each rule resolves to (index: endpoint),
// counters, the clients remembered for affinity and the affinity sets' own
// timeouts are left out, sets and
// chains are sorted by name. Endpoint-map elements no rule reaches are
// counted, so a leak shows.
func churnNormal(k *kernelTable) string {
	var blocks []string
	reached := map[string]map[string]bool{}
	for _, c := range k.chainList {
		txt := k.chainText(c)
		txt = churnCounter.ReplaceAllString(txt, "counter")
		txt = churnChainID.ReplaceAllString(txt, "<id>")
		txt = churnShard.ReplaceAllString(txt, "@endpoints$1-<shard>")
		var b strings.Builder
		b.WriteString(txt)
		for ri, r := range k.rules[c.Name] {
			set, els, _ := k.ruleEndpointElems(r)
			if set == "" {
				continue
			}
			f := portal.IPv4
			if strings.HasPrefix(set, "endpoints6") {
				f = portal.IPv6
			}
			if reached[set] == nil {
				reached[set] = map[string]bool{}
			}
			for _, el := range els {
				reached[set][string(el.Key)] = true
				ap, _ := decodeAddrPortVal(f, el.Val)
				fmt.Fprintf(&b, "\t\t# rule %d: %x -> %v\n", ri, el.Key[4:], ap)
			}
		}
		blocks = append(blocks, b.String())
	}
	orphans := 0
	for _, s := range k.sets {
		switch {
		case s.anonymous():
		case strings.HasPrefix(s.name, "endpoints"):
			for _, el := range k.elems[s.name] {
				if !reached[s.name][string(el.Key)] {
					orphans++
				}
			}
		case strings.HasPrefix(s.name, affinitySetPrefix):
			// The set's own timeout is the one it was created with: a new
			// timeout is in the rule that adds clients (compared with the
			// chains), and the set is kept with its clients.
			els, timeout := k.elems[s.name], s.timeout
			k.elems[s.name], s.timeout = nil, 0
			blocks = append(blocks, k.setText(s))
			k.elems[s.name], s.timeout = els, timeout
		default:
			blocks = append(blocks, k.setText(s))
		}
	}
	sort.Strings(blocks)
	return fmt.Sprintf("%s\n# endpoint-map elements no rule reaches: %d\n", strings.Join(blocks, "\n"), orphans)
}

// lineDiff lists the lines only in a (-) and only in b (+), at most 60.
func lineDiff(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if count[l] > 0 {
			out = append(out, "- "+l)
			count[l]--
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if count[l] < 0 {
			out = append(out, "+ "+l)
			count[l]++
		}
	}
	if len(out) > 60 {
		out = append(out[:60], fmt.Sprintf("... and %d more lines", len(out)-60))
	}
	return strings.Join(out, "\n")
}

// readKernelOf reads b's table in the namespace netnsFD.
func readKernelOf(netnsFD int, b *Backend) (*kernelTable, error) { return readKernel(netnsFD, b.table) }
