package config

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/api/v1alpha1"
)

// BGPPasswordsSecretName is the Secret of the lease namespace in which the
// controller of a split install publishes the BGP passwords (BGPPeer
// spec.passwordSecret) the node agents need. RBAC lets the node agents read
// that Secret by name and no other: a node's token does not reach the
// webhook's key, nor a Secret no BGPPeer names.
const BGPPasswordsSecretName = "onehop-bgp-passwords"

// BGPPasswordsKey is its key holding the passwords as JSON: Secret name ->
// key -> value (base64), the Secrets of the lease namespace as the
// BGPPeers name them.
const BGPPasswordsKey = "passwords"

// bgpPasswords are the values of the Secrets' keys the BGPPeers name as
// passwordSecret (Secret name -> key -> value), read from in.secrets: what
// every process resolves the peers with, and what the controller publishes.
// A key a LoadBalancerWebhook reads (its HMAC key, its CA) is left out and
// named in webhookKeys with the webhook's name: a BGPPeer must not carry
// the webhook's key to every node.
func bgpPasswords(in Objects) (values map[string]map[string][]byte, webhookKeys map[v1alpha1.SecretKeyRef]string) {
	webhookKeys = map[v1alpha1.SecretKeyRef]string{}
	for _, o := range in.Webhooks {
		webhookKeys[o.Spec.SecretRef] = o.Name
		if ca := o.Spec.CAFrom; ca != nil && ca.SecretKeyRef != nil {
			webhookKeys[*ca.SecretKeyRef] = o.Name
		}
	}
	values = map[string]map[string][]byte{}
	for _, o := range in.Peers {
		ref := o.Spec.PasswordSecret
		if ref == nil || webhookKeys[*ref] != "" {
			continue
		}
		v, ok := in.Secrets[ref.Name][ref.Key]
		if !ok {
			continue
		}
		if values[ref.Name] == nil {
			values[ref.Name] = map[string][]byte{}
		}
		values[ref.Name][ref.Key] = v
	}
	return values, webhookKeys
}

// webhookKeyError refuses a BGPPeer whose password is a webhook's key.
func webhookKeyError(ref v1alpha1.SecretKeyRef, webhook string) error {
	return fmt.Errorf("passwordSecret: key %q of Secret %q is read by LoadBalancerWebhook %s; a BGP password needs a key of its own, which every node agent reads", ref.Key, ref.Name, webhook)
}

// decodePasswords reads the published Secret (nil: none yet).
func decodePasswords(s *corev1.Secret) (map[string]map[string][]byte, error) {
	out := map[string]map[string][]byte{}
	if s == nil || len(s.Data[BGPPasswordsKey]) == 0 {
		return out, nil
	}
	if err := json.Unmarshal(s.Data[BGPPasswordsKey], &out); err != nil {
		return map[string]map[string][]byte{}, fmt.Errorf("secret %s, key %s: %w", BGPPasswordsSecretName, BGPPasswordsKey, err)
	}
	return out, nil
}

// encodePasswords is the published Secret's value (encoding/json sorts
// the keys, so equal passwords make equal bytes).
func encodePasswords(pw map[string]map[string][]byte) []byte {
	b, _ := json.Marshal(pw)
	return b
}

// PublishPasswords brings the published Secret to the passwords in force
// (the last Convert's): the controller's leader calls it, once a look, and
// writes only when they differ from what its cache of the lease namespace's
// Secrets shows. With no password and no Secret it creates nothing. It
// returns when to try again after a failed write (zero when none failed).
func (w *Watch) PublishPasswords(ctx context.Context) time.Time {
	ns := w.o.Namespace
	var cur *corev1.Secret
	rv := ""
	if o, ok, _ := w.secret.GetStore().GetByKey(ns + "/" + BGPPasswordsSecretName); ok {
		cur = o.(*corev1.Secret)
		rv = cur.ResourceVersion
	}
	if w.publishedOver != nil {
		if *w.publishedOver == rv {
			return time.Time{} // the cache does not show the last write yet: its event comes
		}
		w.publishedOver = nil
	}
	data := encodePasswords(w.passwords)
	if cur == nil && len(w.passwords) == 0 || cur != nil && bytes.Equal(cur.Data[BGPPasswordsKey], data) && len(cur.Data) == 1 {
		return time.Time{}
	}
	secrets := w.o.Client.CoreV1().Secrets(ns)
	var err error
	if cur == nil {
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: BGPPasswordsSecretName, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/managed-by": "onehop"}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{BGPPasswordsKey: data},
		}, metav1.CreateOptions{})
	} else {
		next := cur.DeepCopy()
		next.Data = map[string][]byte{BGPPasswordsKey: data}
		next.StringData = nil
		_, err = secrets.Update(ctx, next, metav1.UpdateOptions{})
	}
	if err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			w.o.Log.Warn("external: the BGP passwords for the node agents not written; trying again", "secret", BGPPasswordsSecretName, "err", err)
		}
		return time.Now().Add(retryAfter)
	}
	w.publishedOver = &rv
	w.o.Log.Info("external: BGP passwords published for the node agents", "secret", BGPPasswordsSecretName, "secrets", len(w.passwords))
	return time.Time{}
}

// secretData is the lease namespace's Secrets a process resolves the
// custom resources with: a node agent of a split install reads only the
// passwords the controller publishes; a process that runs the cluster-wide
// part reads every Secret of the namespace but the published one.
func (w *Watch) secretData(log *slog.Logger) map[string]map[string][]byte {
	out := map[string]map[string][]byte{}
	for _, o := range w.secret.GetStore().List() {
		s := o.(*corev1.Secret)
		switch {
		case w.published && s.Name == BGPPasswordsSecretName:
			pw, err := decodePasswords(s)
			if err != nil {
				log.Warn("external: the published BGP passwords do not decode; peering without them", "err", err)
			}
			return pw
		case !w.published && s.Name != BGPPasswordsSecretName:
			out[s.Name] = s.Data
		}
	}
	return out
}
