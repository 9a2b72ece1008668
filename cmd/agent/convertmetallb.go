package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/onehop/onehop/external/metallb"
)

// files is a repeatable -f flag.
type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(s string) error { *f = append(*f, s); return nil }

// convertMetalLBCmd prints onehop's custom resources for MetalLB's; what
// does not carry over goes to stderr and, with --strict, fails the command.
func convertMetalLBCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent convert-metallb", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var in files
	fs.Var(&in, "f", "a YAML file of MetalLB's resources (several documents, or a List, as kubectl get -o yaml prints); repeatable; - or none: stdin")
	strict := fs.Bool("strict", false, "fail when anything cannot be carried over")
	secretNS := fs.String("secret-namespace", "onehop-leases", "the hook's leaseNamespace (deploy/'s is onehop-leases), where onehop reads BGP passwords from")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: name files with -f", fs.Args())
	}
	if len(in) == 0 {
		in = files{"-"}
	}
	var inputs [][]byte
	for _, name := range in {
		var b []byte
		var err error
		if name == "-" {
			b, err = io.ReadAll(stdin)
		} else {
			b, err = os.ReadFile(name)
		}
		if err != nil {
			return err
		}
		inputs = append(inputs, b)
	}
	c, err := metallb.Convert(metallb.Options{SecretNamespace: *secretNS}, inputs...)
	if err != nil {
		return err
	}
	y, err := c.YAML()
	if err != nil {
		return err
	}
	if _, err := stdout.Write(y); err != nil {
		return err
	}
	for _, w := range c.Warnings {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	if *strict && len(c.Warnings) > 0 {
		return fmt.Errorf("%d things could not be carried over (--strict)", len(c.Warnings))
	}
	return nil
}
