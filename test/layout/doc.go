// Package layout holds the tests of the project's shape: the arrows
// between its packages run one way (each folder imports only the
// packages its rule names), every package has a doc comment saying what
// it owns, and no hand-written file grows past the length at which it
// holds several concepts. It reads the sources only; nothing is built or
// run.
package layout
