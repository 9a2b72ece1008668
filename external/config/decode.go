package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Decode decodes the external section of the agent's configuration
// strictly: a key it does not know is an error naming it, not a setting
// silently ignored (MetalLB's communities, passwordSecret or interface
// look plausible here and would otherwise do nothing).
func Decode(raw []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, err
	}
	if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("trailing data after the external section")
	}
	return c, nil
}
