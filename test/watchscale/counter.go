package watchscale

import (
	"bytes"
	"io"
	"net/http"
	"sync/atomic"
)

// counter counts what one agent's client receives: bytes of every
// response body, and for watch requests the events (the API server writes
// one JSON object per line on a watch) and their bytes; an event's bytes
// count once it is complete.
type counter struct {
	watches     atomic.Int64 // watch requests opened
	watchEvents atomic.Int64
	watchBytes  atomic.Int64
	otherBytes  atomic.Int64 // bodies of every other response
	requests    atomic.Int64 // requests other than watches
	bookmarks   atomic.Int64 // BOOKMARK events (not in watchEvents or watchBytes)
}

// snapshot is a counter's values at one moment.
type snapshot struct {
	watches, watchEvents, watchBytes, otherBytes, requests int64
}

func (c *counter) snapshot() snapshot {
	return snapshot{c.watches.Load(), c.watchEvents.Load(), c.watchBytes.Load(), c.otherBytes.Load(), c.requests.Load()}
}

func (s snapshot) sub(o snapshot) snapshot {
	return snapshot{s.watches - o.watches, s.watchEvents - o.watchEvents, s.watchBytes - o.watchBytes, s.otherBytes - o.otherBytes, s.requests - o.requests}
}

func (s snapshot) add(o snapshot) snapshot {
	return snapshot{s.watches + o.watches, s.watchEvents + o.watchEvents, s.watchBytes + o.watchBytes, s.otherBytes + o.otherBytes, s.requests + o.requests}
}

// wrap is a rest.Config WrapTransport that counts into c. The body is
// counted as the client reads it, decompressed (the API server does not
// compress watches).
func (c *counter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		watch := r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1"
		if watch {
			c.watches.Add(1)
		} else {
			c.requests.Add(1)
		}
		resp, err := rt.RoundTrip(r)
		if err != nil || resp.Body == nil {
			return resp, err
		}
		resp.Body = &countingBody{ReadCloser: resp.Body, c: c, watch: watch}
		return resp, nil
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type countingBody struct {
	io.ReadCloser
	c     *counter
	watch bool
	// head is the start of the watch event being read (enough to see its
	// type), size what was read of it so far.
	head []byte
	size int64
}

// bookmarkHead starts a BOOKMARK event: the API server's periodic progress
// note, not a change, counted apart.
var bookmarkHead = []byte(`{"type":"BOOKMARK"`)

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if !b.watch {
		b.c.otherBytes.Add(int64(n))
		return n, err
	}
	for rest := p[:n]; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		line := rest
		if i >= 0 {
			line = rest[:i+1]
		}
		rest = rest[len(line):]
		if k := len(bookmarkHead) - len(b.head); k > 0 {
			b.head = append(b.head, line[:min(k, len(line))]...)
		}
		b.size += int64(len(line))
		if i < 0 {
			break
		}
		if bytes.Equal(b.head, bookmarkHead) {
			b.c.bookmarks.Add(1)
		} else {
			b.c.watchEvents.Add(1)
			b.c.watchBytes.Add(b.size)
		}
		b.head, b.size = b.head[:0], 0
	}
	return n, err
}
