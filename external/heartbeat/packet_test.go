package heartbeat

import (
	"errors"
	"testing"
)

func TestEncodeDecode(t *testing.T) {
	key := []byte("shared key")
	for _, m := range []Message{{Node: "n", Incarnation: 1, Seq: 1, Restarting: true}, {Node: "n", Incarnation: 1, Seq: 2}} {
		b, err := Encode(key, m)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := Decode(b, key); err != nil || got != m {
			t.Fatalf("Decode(Encode(%+v)) = %+v, %v", m, got, err)
		}
	}
	m := Message{Node: "node-a.example", Incarnation: 1765000000123456789, Seq: 42, Leaving: true}
	b, err := Encode(key, m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b, key)
	if err != nil || got != m {
		t.Fatalf("Decode(Encode(%+v)) = %+v, %v", m, got, err)
	}
	if _, err := Decode(b, []byte("another key")); !errors.Is(err, ErrBadMAC) {
		t.Errorf("another key: %v, want ErrBadMAC", err)
	}
	if got, err := Decode(b, []byte("another key"), key); err != nil || got != m {
		t.Errorf("under the second key of two: %+v, %v", got, err)
	}
	for i := range b {
		bad := append([]byte(nil), b...)
		bad[i] ^= 0x10
		if _, err := Decode(bad, key); err == nil {
			t.Errorf("byte %d flipped: accepted", i)
		}
	}
	for _, n := range []int{0, 1, len(b) - 1} {
		if _, err := Decode(b[:n], key); !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrBadMAC) {
			t.Errorf("cut to %d bytes: %v", n, err)
		}
	}
	if _, err := Decode(append(b, 0), key); err == nil {
		t.Error("a byte too many: accepted")
	}
}

func TestEncodeRefusesNames(t *testing.T) {
	for _, n := range []int{0, MaxNameLen + 1} {
		if _, err := Encode([]byte("k"), Message{Node: string(make([]byte, n))}); err == nil {
			t.Errorf("a name of %d bytes: encoded", n)
		}
	}
	b, err := Encode([]byte("k"), Message{Node: string(make([]byte, MaxNameLen))})
	if err != nil || len(b) != MaxSize {
		t.Errorf("the longest name: %d bytes, %v; want %d", len(b), err, MaxSize)
	}
}

func FuzzDecode(f *testing.F) {
	key := []byte("k")
	b, _ := Encode(key, Message{Node: "n", Incarnation: 1, Seq: 2})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b, key)
		if err != nil {
			return
		}
		again, err := Encode(key, m)
		if err != nil || string(again) != string(b) {
			t.Fatalf("accepted %x, which encodes back as %x, %v", b, again, err)
		}
	})
}
