package checkpoint

// The shape every snapshot tree must have before anything is written from
// it. A tree made by Create has it by construction; one read from an
// archive (Import) is checked before it is stored, and every tree again
// before a restore writes it.

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
)

// chunkRE is a chunk id: the SHA-256 of its plain bytes, lowercase hex.
var chunkRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// metaBits are the mode bits a snapshot may carry besides the type.
const metaBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// checkTree returns an error wrapping ErrCorrupt unless tree is a tree a
// restore can write without leaving its directory: the root "." first (a
// directory), then clean local paths, each once, each below a directory
// listed before it, so no write ever goes through a symlink of the tree
// (a file "l/x" after a symlink "l" to /etc would) or above its root.
// Entries are directories, symlinks (a non-empty target) or regular files
// (chunk ids well formed, a size not negative); nothing else.
func checkTree(tree []entry) error {
	if len(tree) == 0 || tree[0].Path != "." || tree[0].Mode&^metaBits != fs.ModeDir {
		return fmt.Errorf("tree does not start with its root directory: %w", ErrCorrupt)
	}
	dirs := map[string]bool{".": true}
	seen := map[string]bool{".": true}
	for _, e := range tree[1:] {
		p := e.Path
		if !filepath.IsLocal(p) || filepath.Clean(p) != p || strings.ContainsRune(p, 0) || p == "." {
			return fmt.Errorf("entry %q is not a path inside the tree: %w", p, ErrCorrupt)
		}
		if seen[p] {
			return fmt.Errorf("entry %q twice: %w", p, ErrCorrupt)
		}
		seen[p] = true
		if !dirs[filepath.Dir(p)] {
			return fmt.Errorf("entry %q is not below a directory listed before it: %w", p, ErrCorrupt)
		}
		switch e.Mode &^ metaBits {
		case fs.ModeDir:
			dirs[p] = true
		case fs.ModeSymlink:
			if e.Target == "" || strings.ContainsRune(e.Target, 0) || len(e.Target) >= 4096 {
				return fmt.Errorf("symlink %q: bad target: %w", p, ErrCorrupt)
			}
		case 0:
			if e.Size < 0 {
				return fmt.Errorf("file %q: size %d: %w", p, e.Size, ErrCorrupt)
			}
			for _, id := range e.Chunks {
				if !chunkRE.MatchString(id) {
					return fmt.Errorf("file %q: chunk id %q: %w", p, id, ErrCorrupt)
				}
			}
			continue
		default:
			return fmt.Errorf("entry %q: mode %v: %w", p, e.Mode, ErrCorrupt)
		}
		if len(e.Chunks) != 0 || e.Size != 0 {
			return fmt.Errorf("entry %q: content on a %v: %w", p, e.Mode.Type(), ErrCorrupt)
		}
	}
	return nil
}
