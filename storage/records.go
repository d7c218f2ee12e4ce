package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/agentrunner/runner/internal/atomicfile"
)

// record is what the pool knows of a volume or snapshot: written before
// the driver is touched, marked ready after.
type record struct {
	State  string `json:"state"` // stateCreating or stateReady
	Limits Limits `json:"limits"`
	// From is the volume a snapshot was taken of.
	From string `json:"from,omitempty"`
}

const (
	stateCreating = "creating"
	stateReady    = "ready"
)

func (p *Pool) recordPath(kind, name string) string {
	return filepath.Join(p.dir, "records", kind+"-"+name+".json")
}

func (p *Pool) readRecord(kind, name string) (record, error) {
	b, err := os.ReadFile(p.recordPath(kind, name))
	if errors.Is(err, fs.ErrNotExist) {
		return record{}, fmt.Errorf("%w: %s %s", ErrNotFound, kindWord(kind), name)
	}
	if err != nil {
		return record{}, fmt.Errorf("read record of %s: %w", name, err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return record{}, fmt.Errorf("read record of %s: %w", name, err)
	}
	return r, nil
}

// readReady is readRecord of a finished volume or snapshot: a half-made
// one is not found.
func (p *Pool) readReady(kind, name string) (record, error) {
	r, err := p.readRecord(kind, name)
	if err == nil && r.State != stateReady {
		return record{}, fmt.Errorf("%w: %s %s (half made)", ErrNotFound, kindWord(kind), name)
	}
	return r, err
}

func kindWord(kind string) string {
	if kind == "snap" {
		return "snapshot"
	}
	return "volume"
}

func (p *Pool) writeRecord(kind, name string, r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := writeFileSync(p.recordPath(kind, name), b); err != nil {
		return fmt.Errorf("write record of %s: %w", name, err)
	}
	return nil
}

func (p *Pool) removeRecord(kind, name string) error {
	if err := os.Remove(p.recordPath(kind, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove record of %s: %w", name, err)
	}
	return syncDir(filepath.Join(p.dir, "records"))
}

func writeFileSync(file string, b []byte) error {
	if err := atomicfile.WriteFileSync(file, b, 0o600); err != nil {
		return err
	}
	return syncDir(filepath.Dir(file))
}

func syncDir(dir string) error { return atomicfile.SyncDir(dir) }
