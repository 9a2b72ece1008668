package ipvs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// stateEntry labels one virtual server. IPVS keeps no names, so the backend
// records, next to the kernel state it owns, which Service port each virtual
// server belongs to. Dump uses it for the Service names, Cleanup and full
// syncs to recognise NodePort virtual servers (on node addresses, which are
// not on the dummy interface) as onehop's.
type stateEntry struct {
	Service string   `json:"service"`
	Kind    string   `json:"kind"`
	Local   []string `json:"local,omitempty"` // the port's local endpoints
	// Topology is the port's portal.Portal.Topology.
	Topology string `json:"topology,omitempty"`
}

func readState(path string) map[string]stateEntry {
	m := map[string]stateEntry{}
	b, err := os.ReadFile(path)
	if err == nil {
		_ = json.Unmarshal(b, &m)
	}
	return m
}

// writeState records the labels of pl's servers; it rewrites the file only
// when they changed, atomically.
func writeState(path string, pl *plan) error {
	m := make(map[string]stateEntry, len(pl.Servers))
	for k, v := range pl.Servers {
		m[k.String()] = stateEntry{Service: v.Portal.String(), Kind: v.Kind, Local: pl.Local[v.Portal.String()], Topology: pl.Topology[v.Portal.String()]}
	}
	b, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("ipvs: state file: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("ipvs: state file: %w", err)
	}
	return os.Rename(tmp, path)
}

func removeState(path string) { _ = os.Remove(path) }

// saveState writes the state file for pl. A failure (a read-only root
// filesystem, a full disk) does not fail the sync: the kernel state is
// already applied, and the names stay in memory (b.applied), which is where
// this process's full syncs, Dump and Cleanup look first. It is logged once
// per distinct error, and again when writing works again.
func (b *Backend) saveState(pl *plan) {
	err := writeState(b.stateFile, pl)
	switch {
	case err != nil && err.Error() != b.stateErr:
		b.stateErr = err.Error()
		b.log.Warn("ipvs: cannot write the state file; Service names of virtual servers are kept in memory only, so "+
			"after a restart, NodePort virtual servers of Services deleted meanwhile are not recognised as onehop's "+
			"(mount a writable directory there, e.g. a hostPath on /run)", "file", b.stateFile, "err", err)
	case err == nil && b.stateErr != "":
		b.stateErr = ""
		b.log.Info("ipvs: state file written again", "file", b.stateFile)
	}
}

// namesLocked labels the virtual servers onehop owns: the state file
// (which a previous process may have written), overlaid with what this
// process applied last.
func (b *Backend) namesLocked() map[string]stateEntry {
	names := readState(b.stateFile)
	if b.applied != nil {
		for k, v := range b.applied.Servers {
			names[k.String()] = stateEntry{Service: v.Portal.String(), Kind: v.Kind, Local: b.applied.Local[v.Portal.String()],
				Topology: b.applied.Topology[v.Portal.String()]}
		}
	}
	return names
}
