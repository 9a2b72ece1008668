package config

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"reflect"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/webhook"
)

// webhookRule is an accepted LoadBalancerWebhook: the sender's
// configuration with its HMAC key and CA bundle read, and the pools it is
// told about (nil: every address).
type webhookRule struct {
	name  string
	cfg   webhook.Config
	pools *AdRule
}

// addWebhooks checks the LoadBalancerWebhooks, oldest first: the hook runs
// one sender, so the oldest accepted one is in force and replaces the
// file's webhook section; a newer one is Invalid. It runs after the pools,
// whose names and labels its pool selection is resolved against.
func (out *Converted) addWebhooks(base Config, in Objects, mem, next Memory) {
	var inForce *webhookRule
	for _, o := range oldestFirst(in.Webhooks) {
		v := Verdict{Kind: KindWebhook, Name: o.Name, UID: o.UID, Generation: o.Generation}
		r, err := resolveWebhook(o, in.Secrets, in.ConfigMaps)
		try := func(r webhookRule) error {
			if inForce != nil {
				return fmt.Errorf("LoadBalancerWebhook %s is in force: the hook sends to one webhook", inForce.name)
			}
			inForce = &r
			return nil
		}
		if r, ok := decide(&v, r, err, mem.webhooks, try); ok {
			next.webhooks[o.UID] = r
			if base.Webhook != nil {
				v.Note = "in place of the configuration file's webhook section"
			}
		}
		out.Verdicts = append(out.Verdicts, v)
	}
	if inForce == nil {
		return
	}
	cfg := inForce.cfg
	out.Config.Webhook = &cfg
	if inForce.pools != nil {
		out.Config.webhookPools = map[string]bool{}
		for _, pc := range out.Config.Pools {
			if inForce.pools.selectsAddress(pc.Name, out.ads.PoolLabels) {
				out.Config.webhookPools[pc.Name] = true
			}
		}
	}
}

// resolveWebhook checks a LoadBalancerWebhook alone and reads its HMAC key
// and CA bundle from the Secrets and ConfigMaps of the lease namespace.
func resolveWebhook(o *v1alpha1.LoadBalancerWebhook, secrets, configMaps map[string]map[string][]byte) (webhookRule, error) {
	s := o.Spec
	r := webhookRule{name: o.Name}
	if s.TimeoutSeconds < 0 || s.MaxBackoffSeconds < 0 {
		return r, errors.New("timeoutSeconds and maxBackoffSeconds must be positive")
	}
	key, err := keyValue(secrets, "Secret", s.SecretRef, "secretRef")
	if err != nil {
		return r, err
	}
	r.cfg = webhook.Config{URL: s.URL, AllowInsecureHTTP: s.AllowInsecureHTTP, Secret: string(bytes.TrimSpace(key)),
		TimeoutSeconds: float64(s.TimeoutSeconds), MaxBackoffSeconds: float64(s.MaxBackoffSeconds)}
	switch ca := s.CAFrom; {
	case s.CABundle != "" && ca != nil:
		err = errors.New("caBundle and caFrom exclude each other")
	case s.CABundle != "":
		r.cfg.CA = []byte(s.CABundle)
	case ca == nil:
	case (ca.SecretKeyRef == nil) == (ca.ConfigMapKeyRef == nil):
		err = errors.New("caFrom: exactly one of secretKeyRef and configMapKeyRef")
	case ca.SecretKeyRef != nil:
		r.cfg.CA, err = keyValue(secrets, "Secret", *ca.SecretKeyRef, "caFrom.secretKeyRef")
	default:
		r.cfg.CA, err = keyValue(configMaps, "ConfigMap", *ca.ConfigMapKeyRef, "caFrom.configMapKeyRef")
	}
	if err != nil {
		return r, err
	}
	if err := r.cfg.Check(); err != nil {
		return r, err
	}
	if len(s.IPAddressPools)+len(s.IPAddressPoolSelectors) > 0 {
		ad, err := newAdRule(o.Name, s.PoolSelection, nil, nil, "")
		if err != nil {
			return r, err
		}
		r.pools = &ad
	}
	return r, nil
}

// keyValue is the value of ref's key among objs (the Secrets or ConfigMaps
// of the lease namespace: name -> key -> value); field names the reference
// in the error.
func keyValue(objs map[string]map[string][]byte, kind string, ref v1alpha1.SecretKeyRef, field string) ([]byte, error) {
	data, ok := objs[ref.Name]
	if !ok {
		return nil, fmt.Errorf("%s: no %s %q in the lease namespace", field, kind, ref.Name)
	}
	v, ok := data[ref.Key]
	if !ok || len(v) == 0 {
		return nil, fmt.Errorf("%s: %s %q has no key %q", field, kind, ref.Name, ref.Key)
	}
	return v, nil
}

// WebhookPicks reports whether the webhook is told about ip: with no
// pool selection every address, else those of the pools picked.
func (p *Parsed) WebhookPicks(ip netip.Addr) bool {
	if p.webhookPools == nil {
		return true
	}
	for i := range p.IPAMPools {
		if p.IPAMPools[i].Contains(ip) {
			return p.webhookPools[p.IPAMPools[i].Name]
		}
	}
	return false
}

// SameWebhook: the webhook sender need not start again.
func SameWebhook(a, b *Parsed) bool {
	return reflect.DeepEqual(a.Webhook, b.Webhook) && reflect.DeepEqual(a.webhookPools, b.webhookPools)
}

// WebhookSource says where the webhook in force comes from.
func (c *Converted) WebhookSource(base Config) string {
	for _, v := range c.Verdicts {
		if v.Kind == KindWebhook && (v.Err == nil || v.Stale) {
			if base.Webhook != nil {
				return "LoadBalancerWebhook " + v.Name + ", in place of the configuration file's webhook section"
			}
			return "LoadBalancerWebhook " + v.Name
		}
	}
	if base.Webhook != nil {
		return "the configuration file"
	}
	return "none"
}
