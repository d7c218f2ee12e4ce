package daemon

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrunner/runner/netpolicy"
)

// TestNetTableChoice: the table of a netpolicy state directory. A fresh
// one gets netpolicy.TablePrefix and 4 hex digits from its hash, saved
// and the same on the next start; one whose derived name a live runnerd
// in the same namespace holds gets the next; one that already holds
// sandboxes of a version that shared netpolicy.DefaultTable keeps that
// table (their rules and rn* veths are there); a saved name a live
// runnerd in the same namespace holds (a copied state directory) is
// refused, naming it, while one in another namespace does not count.
func TestNetTableChoice(t *testing.T) {
	sum := sha256.Sum256([]byte("/state/a"))
	derived := fmt.Sprintf("%s%04x", netpolicy.TablePrefix, binary.BigEndian.Uint16(sum[8:10]))
	next := fmt.Sprintf("%s%04x", netpolicy.TablePrefix, binary.BigEndian.Uint16(sum[8:10])+1)
	saved := func(t *testing.T, dir string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, tableFile))
		if err != nil {
			t.Fatalf("no saved table: %v", err)
		}
		return strings.TrimSpace(string(b))
	}
	holder := claim{StateDir: "/state/b", PID: 4242, NetNS: "4:1", Table: derived}

	t.Run("fresh: derived, saved, stable", func(t *testing.T) {
		dir := t.TempDir()
		got, err := netTable(dir, sum, "4:1", nil)
		if err != nil || got != derived || saved(t, dir) != derived {
			t.Fatalf("got %q, %v (saved %q), want %q", got, err, saved(t, dir), derived)
		}
		// Restarted while another runnerd now holds the next value, and
		// in another namespace one holding the same: the saved name.
		others := []claim{{NetNS: "4:1", Table: next}, {NetNS: "4:2", Table: derived}}
		if got, err := netTable(dir, sum, "4:1", others); err != nil || got != derived {
			t.Fatalf("restart: got %q, %v, want %q", got, err, derived)
		}
	})
	t.Run("derived name held: the next", func(t *testing.T) {
		got, err := netTable(t.TempDir(), sum, "4:1", []claim{holder})
		if err != nil || got != next {
			t.Fatalf("got %q, %v, want %q", got, err, next)
		}
	})
	t.Run("legacy sandboxes keep runner", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "sandboxes"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "sandboxes", "x-0123456789abcdef.json"), []byte(`{"id":"x-0123456789abcdef","slot":0}`), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := netTable(dir, sum, "4:1", nil)
		if err != nil || got != netpolicy.DefaultTable || saved(t, dir) != netpolicy.DefaultTable {
			t.Fatalf("got %q, %v, want %q saved", got, err, netpolicy.DefaultTable)
		}
	})
	t.Run("saved name held by a live runnerd refused", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, tableFile), []byte(derived+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := netTable(dir, sum, "4:1", []claim{holder})
		if !errors.Is(err, errClaimed) || !strings.Contains(err.Error(), "runnerd pid 4242 (state directory /state/b)") {
			t.Fatalf("got %v, want errClaimed naming runnerd pid 4242 (state directory /state/b)", err)
		}
		if got, err := netTable(dir, sum, "4:2", []claim{holder}); err != nil || got != derived {
			t.Fatalf("another namespace: got %q, %v, want %q", got, err, derived)
		}
	})
}

// TestIfPrefixes: the interface prefixes of tables never match each
// other's veth names: DefaultTable's is rn, a derived table's r and its 4
// hex digits (no hex digit is n), any other name's r and 4 hex digits.
func TestIfPrefixes(t *testing.T) {
	for _, tt := range []struct{ table, want string }{
		{netpolicy.DefaultTable, "rn"},
		{"runner-0a9f", "r0a9f"},
		{"runner-0A9F", ""}, // not derived: hashed
		{"mine", ""},
	} {
		got := netpolicy.IfPrefix(tt.table)
		if tt.want != "" && got != tt.want {
			t.Errorf("IfPrefix(%q) = %q, want %q", tt.table, got, tt.want)
		}
		if len(got) != 5 && got != "rn" || strings.HasPrefix(got, "rn") && got != "rn" {
			t.Errorf("IfPrefix(%q) = %q: want rn or r and 4 hex digits", tt.table, got)
		}
	}
}
