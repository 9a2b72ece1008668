package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

const (
	// SignatureHeader carries "sha256=<hex HMAC-SHA256>" keyed with the
	// shared secret, over the timestamp, a dot and the body (see Sign).
	SignatureHeader = "X-Onehop-Signature-256"
	// TimestampHeader carries the time the request was signed, in decimal
	// Unix seconds. Every attempt, retries included, is signed afresh.
	TimestampHeader = "X-Onehop-Timestamp"
	// DefaultMaxAge is how far a request's timestamp may be from the
	// receiver's clock, either way, before VerifyRequest rejects it.
	DefaultMaxAge = 5 * time.Minute
)

// Errors of VerifyRequest.
var (
	ErrBadSignature = errors.New("webhook: bad or missing signature")
	ErrStale        = errors.New("webhook: request timestamp outside the accepted window")
)

// Sign returns the SignatureHeader value for body signed at timestamp
// (Unix seconds): the HMAC-SHA256, keyed with secret, of the decimal
// timestamp, ".", and the body.
func Sign(secret []byte, timestamp int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(strconv.AppendInt(nil, timestamp, 10))
	m.Write([]byte{'.'})
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// SignRequest sets TimestampHeader and SignatureHeader on h for body, signed
// at now.
func SignRequest(secret []byte, h http.Header, body []byte, now time.Time) {
	ts := now.Unix()
	h.Set(TimestampHeader, strconv.FormatInt(ts, 10))
	h.Set(SignatureHeader, Sign(secret, ts, body))
}

// VerifyRequest checks a received request: the signature over its
// timestamp and body (in constant time), then that the timestamp is within
// maxAge of now, either way (DefaultMaxAge when maxAge <= 0). It returns
// nil, or an error wrapping ErrBadSignature or ErrStale.
//
// A request replayed within the window carries a generation the receiver
// has already applied, so the generation rules (Mirror) make it a no-op;
// the window bounds how long a captured request stays usable at all.
func VerifyRequest(secret []byte, h http.Header, body []byte, now time.Time, maxAge time.Duration) error {
	if maxAge <= 0 {
		maxAge = DefaultMaxAge
	}
	raw := h.Get(TimestampHeader)
	ts, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s %q is not Unix seconds", ErrBadSignature, TimestampHeader, raw)
	}
	if !hmac.Equal([]byte(Sign(secret, ts, body)), []byte(h.Get(SignatureHeader))) {
		return ErrBadSignature
	}
	age := now.Sub(time.Unix(ts, 0))
	if age > maxAge || age < -maxAge {
		return fmt.Errorf("%w: signed %s ago, window ±%s", ErrStale, age.Round(time.Second), maxAge)
	}
	return nil
}
