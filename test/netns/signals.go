package netns

import (
	"os"
	"os/signal"
	"syscall"
)

// closeOnSignal tears the cluster down when the process gets SIGINT or
// SIGTERM (Ctrl-C in `go test` or `make demo`), then exits with the
// conventional status. The returned function stops listening.
func (c *Cluster) closeOnSignal() func() {
	ch := make(chan os.Signal, 1)
	done := make(chan struct{})
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-ch:
			c.log.Warn("signal: tearing the cluster down", "signal", sig, "id", c.ID)
			c.Close()
			os.Exit(128 + int(sig.(syscall.Signal)))
		case <-done:
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}
