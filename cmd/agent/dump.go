package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/onehop/onehop/dataplane"
)

// dumpCmd prints the kernel's state (not a daemon's memory): it works with
// no agent running and no API server reachable.
func dumpCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent dump-rules", flag.ContinueOnError)
	fs.SetOutput(stderr)
	output := fs.String("o", "table", "output: table, json, or nft (the ruleset in nft syntax, as nft list table prints it)")
	dpName := fs.String("dataplane", "nft", "the dataplane to read: nft or ipvs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dp, err := newDataplane(*dpName, dataplane.Config{}, "", time.Minute, slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		return err
	}
	d, err := dp.Dump(ctx)
	if err != nil {
		return err
	}
	switch *output {
	case "table":
		return d.WriteTable(stdout)
	case "json":
		return d.WriteJSON(stdout)
	case "nft", "raw":
		_, err := io.WriteString(stdout, d.Raw)
		return err
	}
	return fmt.Errorf("-o %q: must be table, json or nft", *output)
}
