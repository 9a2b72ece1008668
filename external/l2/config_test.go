package l2

import (
	"testing"
	"time"
)

func TestHeartbeatConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		c  *HeartbeatConfig
		ok bool
	}{
		{nil, true},
		{&HeartbeatConfig{}, true},
		{&HeartbeatConfig{KeyFile: "/k", Port: 7947, IntervalMillis: 100, Missed: 3}, true},
		{&HeartbeatConfig{Port: 65536}, false},
		{&HeartbeatConfig{Port: -1}, false},
		{&HeartbeatConfig{IntervalMillis: 5}, false},
		{&HeartbeatConfig{IntervalMillis: -100}, false},
		{&HeartbeatConfig{Missed: -1}, false},
	} {
		if err := tc.c.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v, want ok %v", tc.c, err, tc.ok)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		c             Config
		ok            bool
		every, jitter time.Duration
	}{
		{Config{}, true, 0, 0},
		{Config{GratuitousIntervalSeconds: 30}, true, 30 * time.Second, 3 * time.Second},
		{Config{GratuitousIntervalSeconds: 10, GratuitousJitterSeconds: 5}, true, 10 * time.Second, 5 * time.Second},
		{Config{GratuitousIntervalSeconds: 10, GratuitousJitterSeconds: 6}, false, 0, 0},
		{Config{GratuitousIntervalSeconds: 0.5}, false, 0, 0},
		{Config{GratuitousIntervalSeconds: -1}, false, 0, 0},
		{Config{GratuitousJitterSeconds: 1}, false, 0, 0},
		{Config{Heartbeat: &HeartbeatConfig{Port: -1}}, false, 0, 0},
	} {
		if err := tc.c.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v, want ok %v", tc.c, err, tc.ok)
		}
		if every, jitter := tc.c.Periodic(); tc.ok && (every != tc.every || jitter != tc.jitter) {
			t.Errorf("%+v: periodic every %v ± %v, want %v ± %v", tc.c, every, jitter, tc.every, tc.jitter)
		}
	}
}
