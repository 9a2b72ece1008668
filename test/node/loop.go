package node

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

// RequestLoop sends an HTTP GET over a new connection every period from a
// network namespace, and counts the answers and the failures, until Stop.
type RequestLoop struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	ok       int
	failures []string
	answers  map[string]int
}

// StartRequestLoop starts a loop from netns to url.
func StartRequestLoop(netns, url string, period time.Duration) *RequestLoop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &RequestLoop{cancel: cancel, done: make(chan struct{}), answers: map[string]int{}}
	client := &http.Client{
		Transport: &http.Transport{DialContext: nsutil.Dialer(netns), DisableKeepAlives: true},
		Timeout:   2 * time.Second,
	}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			body, err := get(ctx, client, url)
			if ctx.Err() != nil {
				return
			}
			l.mu.Lock()
			if err != nil {
				l.failures = append(l.failures, time.Now().Format("15:04:05.000")+" "+err.Error())
			} else {
				l.ok++
				l.answers[body]++
			}
			l.mu.Unlock()
		}
	}()
	return l
}

func get(ctx context.Context, client *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return strings.TrimSpace(string(b)), nil
}

// Stop ends the loop and returns how many requests were answered, by
// whom, and the failures.
func (l *RequestLoop) Stop() (ok int, answers map[string]int, failures []string) {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok, l.answers, l.failures
}
