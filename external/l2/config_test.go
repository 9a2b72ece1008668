package l2

import "testing"

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
