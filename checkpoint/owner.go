package checkpoint

import (
	"context"
	"io"
	"io/fs"
)

// Owner is the one numeric owner every entry of an imported checkpoint is
// given (ImportAs): the receiving sandbox's identity.
//
// Why: an archive names owners as the sending host numbered them, and
// Restore runs as root and lchowns each entry to what its snapshot says.
// Kept as they come, a hostile peer's archive plants a setuid-root
// program in the receiving sandbox (or hands a file to another sandbox's
// uid on this host), and an honest one leaves the files owned by a uid
// that is not the receiving sandbox's, which then cannot write them.
type Owner struct {
	UID, GID int
}

// apply gives every entry of sn to o and clears setuid and setgid on
// everything but directories (a setgid directory only makes new files
// take its group, which is o's). A setuid program owned by the sandbox's
// own uid would grant nothing the sandbox lacks, but the bit is cleared
// anyway: it is a privilege the receiving host never granted.
func (o Owner) apply(sn *snapshot) {
	for _, t := range sn.Trees {
		for i := range t {
			e := &t[i]
			e.UID, e.GID = o.UID, o.GID
			if !e.Mode.IsDir() {
				e.Mode &^= fs.ModeSetuid | fs.ModeSetgid
			} else {
				e.Mode &^= fs.ModeSetuid
			}
		}
	}
}

// ImportAs is Import with every entry of the checkpoint given to owner
// and its setuid bits (setgid too, on everything but directories)
// cleared before anything is kept: what a restore of it then writes. An
// archive already imported the same way is found identical (the same
// remapped trees), so a repeated ImportAs changes nothing.
func (s *Store) ImportAs(ctx context.Context, r io.Reader, owner Owner) (Info, error) {
	return s.importArchive(ctx, r, &owner)
}
