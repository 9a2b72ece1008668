// Package external holds the end-to-end tests of package external's
// providers: real routing daemons (BIRD 2), real network namespaces, veth
// pairs and bridges, real TCP through them. Run as root; tests skip with a
// message when root, `ip`, `nft` or `bird` is missing.
package external
