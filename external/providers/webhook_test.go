package providers

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/webhook"
	"github.com/onehop/onehop/portal"
)

// TestWebhookAnnounced: onehop_announced_ips of the webhook is the number
// of distinct IPs the leader last sent (two Services sharing one count it
// once), and 0 when it does not lead.
func TestWebhookAnnounced(t *testing.T) {
	n, err := webhook.New(webhook.Config{URL: "https://127.0.0.1:1/hook", Secret: "s3cret"}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := portal.ServiceKey{Namespace: "default", Name: "a"}, portal.ServiceKey{Namespace: "default", Name: "b"}
	ip1, ip2 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	st := &State{Leader: true, Targets: []Target{{IP: ip1, Service: a}, {IP: ip1, Service: b}, {IP: ip2, Service: b}}}
	p := &Webhook{n: n}
	if err := p.Update(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	if got := p.Announced(); got != 2 {
		t.Errorf("leader sending 2 IPs of 2 Services: announced %d, want 2", got)
	}
	st.Leader = false
	if err := p.Update(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	if got := p.Announced(); got != 0 {
		t.Errorf("not leading: announced %d, want 0", got)
	}
}

// TestWebhookOutcome: a request nothing answered (the HTTP client's own
// error) is unreachable; an answer other than 2xx is rejected.
func TestWebhookOutcome(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	_, err = http.Get("http://" + addr + "/")
	if err == nil {
		t.Fatal("a closed port answered")
	}
	if got := WebhookOutcome(fmt.Errorf("attempt 3: %w", err)); got != dataplane.WebhookUnreachable {
		t.Errorf("connection refused: %s, want %s", got, dataplane.WebhookUnreachable)
	}
	if got := WebhookOutcome(errors.New("webhook https://hook.example answered 503 Service Unavailable")); got != dataplane.WebhookRejected {
		t.Errorf("a 503 answer: %s, want %s", got, dataplane.WebhookRejected)
	}
}

// TestWebhookPicks: the receiver is told about the addresses picks picks
// alone, each Service's together; with no picks, about every address.
func TestWebhookPicks(t *testing.T) {
	ip := netip.MustParseAddr
	st := &State{Leader: true, Targets: []Target{
		{IP: ip("192.0.2.1"), Service: portal.ServiceKey{Namespace: "a", Name: "both"}},
		{IP: ip("198.51.100.1"), Service: portal.ServiceKey{Namespace: "a", Name: "int"}},
		{IP: ip("198.51.100.2"), Service: portal.ServiceKey{Namespace: "a", Name: "both"}},
		{IP: ip("203.0.113.1"), Service: portal.ServiceKey{Namespace: "a", Name: "pub"}},
	}}
	internal := netip.MustParsePrefix("198.51.100.0/24")
	var got []string
	for _, pl := range webhookPayloads(st, func(a netip.Addr) bool { return !internal.Contains(a) }) {
		got = append(got, pl.Service+"="+strings.Join(pl.IPs, ","))
	}
	if want := []string{"a/both=192.0.2.1", "a/pub=203.0.113.1"}; !slices.Equal(got, want) {
		t.Errorf("payloads %v, want %v", got, want)
	}
	if n := payloadIPs(webhookPayloads(st, nil)); n != len(st.Targets) {
		t.Errorf("no picks: told about %d IPs, want %d", n, len(st.Targets))
	}
}
