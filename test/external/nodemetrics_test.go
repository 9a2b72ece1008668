package external

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"testing"
	"time"
)

// nodeMetric returns the value of series (name{labels} as exposed) from
// node n's agent (startNodeAgent), or "" when it has no such series.
func (s *split) nodeMetric(t *testing.T, n, series string) string {
	t.Helper()
	sock := s.metricsSocket(n)
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://" + n + "/metrics")
	if err != nil {
		return "" // not serving yet
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// waitNodeMetric waits until node n's series has the value want ("" for
// none).
func (s *split) waitNodeMetric(t *testing.T, n, series, want string) {
	t.Helper()
	if _, ok := waitFor(context.Background(), 15*time.Second, func() bool { return s.nodeMetric(t, n, series) == want }); !ok {
		t.Fatalf("%s's %s = %q, want %q", n, series, s.nodeMetric(t, n, series), want)
	}
}
