package providers

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/webhook"
)

// Webhook: the leader sends every Service's state; sent is how many IPs
// that state last held (0 while not leading). picks, when set, says which
// addresses the receiver is told about; stop, when set, is called as the
// sender closes. last is the state last set, for a sender whose term
// begins after it (Resend).
type Webhook struct {
	n     *webhook.Notifier
	sent  int
	picks func(netip.Addr) bool
	stop  func()
	mu    sync.Mutex
	last  []webhook.Payload
}

// NewWebhook is the provider of the sender n, telling it about the
// addresses picks picks (nil: all) and calling stop (when set) as it
// closes.
func NewWebhook(n *webhook.Notifier, picks func(netip.Addr) bool, stop func()) *Webhook {
	return &Webhook{n: n, picks: picks, stop: stop}
}

// Name is "webhook".
func (p *Webhook) Name() string { return "webhook" }

// Announced is how many IPs the state last sent held (0 while not
// leading).
func (p *Webhook) Announced() int { return p.sent }

// Update sends the state of every Service while leading.
func (p *Webhook) Update(_ context.Context, s *State) error {
	if !s.Leader {
		p.sent = 0
		return nil
	}
	payloads := webhookPayloads(s, p.picks)
	p.mu.Lock()
	p.last = payloads
	p.n.Set(payloads)
	p.mu.Unlock()
	p.sent = payloadIPs(payloads)
	return nil
}

// Resend sets the last state again: the first Set of a term that began
// after it sends it as the snapshot.
func (p *Webhook) Resend() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last != nil {
		p.n.Set(p.last)
	}
}

// Close ends the sender's term: what it has pending is dropped.
func (p *Webhook) Close(context.Context) error {
	p.n.Demote()
	if p.stop != nil {
		p.stop()
	}
	p.n.Wait()
	return nil
}

// webhookPayloads groups targets by Service, of the addresses picks picks
// (nil: all).
func webhookPayloads(s *State, picks func(netip.Addr) bool) []webhook.Payload {
	by := map[string]*webhook.Payload{}
	var order []string
	for _, t := range s.Targets {
		if picks != nil && !picks(t.IP) {
			continue
		}
		name := t.Service.String()
		if t.Pod {
			name = "pod/" + name
		}
		pl := by[name]
		if pl == nil {
			pl = &webhook.Payload{Service: name, IPs: []string{}, Ports: []webhook.Port{}, Nodes: []webhook.Node{}, HealthCheckNodePort: t.HealthCheckNodePort}
			for _, port := range t.Ports {
				pl.Ports = append(pl.Ports, webhook.Port{Port: port.Port, Protocol: strings.ToUpper(port.Protocol.String())})
			}
			for _, n := range t.Nodes {
				node := webhook.Node{Name: n, Addresses: []string{}}
				for _, a := range s.NodeAddresses[n] {
					node.Addresses = append(node.Addresses, a.String())
				}
				pl.Nodes = append(pl.Nodes, node)
			}
			by[name] = pl
			order = append(order, name)
		}
		pl.IPs = append(pl.IPs, t.IP.String())
	}
	slices.Sort(order)
	out := make([]webhook.Payload, 0, len(order))
	for _, n := range order {
		out = append(out, *by[n])
	}
	return out
}

// payloadIPs counts the distinct IPs of payloads.
func payloadIPs(payloads []webhook.Payload) int {
	seen := map[string]bool{}
	for _, pl := range payloads {
		for _, ip := range pl.IPs {
			seen[ip] = true
		}
	}
	return len(seen)
}

// WebhookOutcome is the outcome of one webhook request that failed with
// err: no answer (the HTTP client's errors are *url.Error), or an answer
// other than 2xx.
func WebhookOutcome(err error) string {
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		return dataplane.WebhookUnreachable
	}
	return dataplane.WebhookRejected
}
