// Package config owns the agent's configuration: the settings `agent run`
// resolves (Settings) and their defaults (Defaults), the --config file they
// are read from besides the flags (LoadFile: a KubeProxyConfiguration as
// kubeadm's kube-proxy ConfigMap holds it, an OnehopConfiguration, or both as
// two YAML documents), the rule that merges the two (Settings.Resolve: the
// flags given on the command line over the file over the defaults), the
// checks flags and file share, so that both accept the same values, and the
// table of what onehop does with each KubeProxyConfiguration field
// (kubeProxyFields, which docs/migration.md prints).
//
// It reads and checks; it applies nothing. The CLI (cmd/agent) defines the
// flags, passes what they hold in, and wires the resolved settings into the
// model, the dataplanes and the cloud hook. It imports portal and external
// only to check their parts of the file (service limits and balancing; the
// external section, which external/config decodes), and must never
// import nft, ipvs or cmd/agent.
package config
