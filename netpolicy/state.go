package netpolicy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentrunner/runner/internal/atomicfile"
)

// record is what the Manager persists per sandbox, so a restarted daemon
// re-adopts the same addresses and the same allowlist.
type record struct {
	ID     string `json:"id"`
	Slot   int    `json:"slot"`
	Policy Policy `json:"policy"`
}

func (m *Manager) recordPath(id string) string {
	return filepath.Join(m.cfg.StateDir, "sandboxes", id+".json")
}

func (m *Manager) netnsPath(id string) string {
	return filepath.Join(m.cfg.StateDir, "netns", id)
}

func (m *Manager) resolvConfPath(id string) string {
	return filepath.Join(m.cfg.StateDir, "resolv", id+".conf")
}

// writeFileAtomic writes data to path (making its directory) via a synced
// temporary file and a rename, so a crash leaves the old or the new
// content, never a mix.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFileSync(path, data, perm)
}

func (m *Manager) saveRecord(r record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode record %s: %w", r.ID, err)
	}
	if err := writeFileAtomic(m.recordPath(r.ID), data, 0o600); err != nil {
		return fmt.Errorf("write record %s: %w", r.ID, err)
	}
	return nil
}

// loadRecords reads every persisted sandbox record.
func (m *Manager) loadRecords() (map[string]record, error) {
	dir := filepath.Join(m.cfg.StateDir, "sandboxes")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]record{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read records: %w", err)
	}
	out := map[string]record{}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read record %s: %w", name, err)
		}
		var r record
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("decode record %s: %w", name, err)
		}
		if r.ID+".json" != name || checkID(r.ID) != nil {
			return nil, fmt.Errorf("decode record %s: id %q does not match", name, r.ID)
		}
		out[r.ID] = r
	}
	return out, nil
}
