package soak

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"
)

// The environment variables that shape a run (see the package comment).
const (
	EnvDuration = "ONEHOP_SOAK_DURATION"
	EnvInterval = "ONEHOP_SOAK_INTERVAL"
	EnvRate     = "ONEHOP_SOAK_RATE"
	EnvSeed     = "ONEHOP_SOAK_SEED"
	EnvReport   = "ONEHOP_SOAK_REPORT"
)

// Defaults of a run with none of them set: the run `make test` makes.
const (
	DefaultDuration = 5 * time.Minute
	DefaultRate     = 100.0
)

// Knobs are a run's settings.
type Knobs struct {
	Duration time.Duration
	Interval time.Duration // between samples
	Rate     float64       // target changes per second
	Seed     uint64
	Report   string // a file to append the run's table to
}

// KnobsFromEnv reads the settings. The interval defaults to a twentieth of
// the run, at least 15 s and at most a minute; the seed to a random one.
func KnobsFromEnv() (Knobs, error) {
	k := Knobs{Duration: DefaultDuration, Rate: DefaultRate, Seed: rand.Uint64() % 1e6, Report: os.Getenv(EnvReport)}
	for name, d := range map[string]*time.Duration{EnvDuration: &k.Duration, EnvInterval: &k.Interval} {
		if s := os.Getenv(name); s != "" {
			v, err := time.ParseDuration(s)
			if err != nil || v <= 0 {
				return k, fmt.Errorf("%s=%q: want a positive duration", name, s)
			}
			*d = v
		}
	}
	if k.Interval == 0 {
		k.Interval = min(max(k.Duration/20, 15*time.Second), time.Minute)
	}
	if s := os.Getenv(EnvRate); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			return k, fmt.Errorf("%s=%q: want a positive number of changes per second", EnvRate, s)
		}
		k.Rate = v
	}
	if s := os.Getenv(EnvSeed); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return k, fmt.Errorf("%s=%q: want a number", EnvSeed, s)
		}
		k.Seed = v
	}
	return k, nil
}
