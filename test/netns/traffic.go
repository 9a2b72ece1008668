package netns

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

// ConvergeTimeout bounds how long traffic may take to follow an API change.
// It is a liveness bound, not a performance threshold: latencies are logged.
const ConvergeTimeout = 60 * time.Second

// pollGap is the pause between failed probes.
const pollGap = 20 * time.Millisecond

// WaitBackends sends fresh requests (new connection, new source port each)
// from namespace from to proto addr until it has a streak of answers coming
// only from want in which every pod of want answered. It returns the time
// from since (the API change) to the start of the request, within that
// streak, that the last pod of want answered: the programming latency as
// traffic sees it (it includes the few requests random endpoint choice
// needs to reach every pod), to within the pause between requests.
func WaitBackends(ctx context.Context, from, proto, addr string, want []*Pod, since time.Time) (time.Duration, error) {
	return WaitBackendsEvery(ctx, from, proto, addr, want, since, pollGap)
}

// WaitBackendsEvery is WaitBackends pausing gap between requests that
// reach the wrong pod or fail: a shorter gap measures the latency more
// finely, for more requests.
func WaitBackendsEvery(ctx context.Context, from, proto, addr string, want []*Pod, since time.Time, gap time.Duration) (time.Duration, error) {
	if len(want) == 0 {
		return WaitUnserved(ctx, from, proto, addr, since)
	}
	ctx, cancel := context.WithTimeout(ctx, ConvergeTimeout)
	defer cancel()
	allowed := map[string]bool{}
	for _, p := range want {
		allowed[p.Name] = true
	}
	need := 12 * len(want)
	var (
		streak int
		seen   = map[string]int{}
		all    time.Time // when the streak had seen every pod of want
		last   string
	)
	for {
		began := time.Now()
		rep, err := nsutil.Request(ctx, from, proto, addr)
		switch {
		case err != nil:
			last, streak = err.Error(), 0
		case !allowed[rep.Name]:
			last, streak = fmt.Sprintf("answered by %s, not one of %s", rep.Name, names(want)), 0
		default:
			if streak == 0 {
				seen, all = map[string]int{}, time.Time{}
			}
			streak++
			seen[rep.Name]++
			if len(seen) == len(want) && all.IsZero() {
				all = began
			}
			if streak >= need && !all.IsZero() {
				return all.Sub(since), nil
			}
			continue
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%s %s from %s: no steady answers from %s within %v: last: %s (streak %d, seen %v)",
				proto, addr, from, names(want), ConvergeTimeout, last, streak, seen)
		case <-time.After(gap):
		}
	}
}

// WaitAnswer polls until proto addr answers once from namespace from and
// returns that reply and the time since since.
func WaitAnswer(ctx context.Context, from, proto, addr string, since time.Time) (nsutil.Reply, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, ConvergeTimeout)
	defer cancel()
	for {
		rep, err := nsutil.Request(ctx, from, proto, addr)
		if err == nil {
			return rep, time.Since(since), nil
		}
		select {
		case <-ctx.Done():
			return rep, 0, fmt.Errorf("%s %s from %s: no answer within %v: %v", proto, addr, from, ConvergeTimeout, err)
		case <-time.After(pollGap):
		}
	}
}

// WaitUnserved polls until proto addr stops answering from namespace from
// (a streak of failed requests) and returns the time since since.
func WaitUnserved(ctx context.Context, from, proto, addr string, since time.Time) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, ConvergeTimeout)
	defer cancel()
	const need = 5
	var (
		streak      int
		streakStart time.Time
		last        string
	)
	for {
		at := time.Now()
		rep, err := nsutil.Request(ctx, from, proto, addr)
		if err != nil && ctx.Err() == nil {
			if streak == 0 {
				streakStart = at
			}
			streak++
			if streak >= need {
				return streakStart.Sub(since), nil
			}
			continue
		}
		if err == nil {
			last, streak = "answered by "+rep.Name, 0
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%s %s from %s still answers after %v: %s", proto, addr, from, ConvergeTimeout, last)
		case <-time.After(pollGap):
		}
	}
}

func names(pods []*Pod) string {
	var s []string
	for _, p := range pods {
		s = append(s, p.Name)
	}
	sort.Strings(s)
	return "[" + strings.Join(s, " ") + "]"
}
