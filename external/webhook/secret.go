package webhook

import (
	"bytes"
	"fmt"
	"os"
)

func readSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("webhook: secret: %w", err)
	}
	return bytes.TrimSpace(b), nil
}
