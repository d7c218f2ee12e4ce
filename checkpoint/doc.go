// Package checkpoint stores frozen instants of a sandbox's disk and puts
// them back: content-defined chunks (restic's Rabin chunker), each
// compressed with zstd and named by the SHA-256 of its plain bytes, so a
// second checkpoint of a tree that changed little stores little.
//
// A Store is one sandbox's checkpoints in one directory:
//
//	index.json            the checkpoints that exist (tmp+fsync+rename)
//	snapshots/ID.json     one checkpoint's trees: path, mode, owner, mtime,
//	                      symlink target, chunk ids of every entry
//	chunks/ab/abcdef...   zstd of one chunk, named by the plain bytes' hash
//	restore.json          present only while a restore swaps directories
//	dirty                 present only while a checkpoint is being made
//	                      or imported
//
// Invariants:
//   - A checkpoint exists exactly when index.json lists it. Its snapshot
//     and every chunk it names are durable (syncfs) before the index that
//     lists it is renamed into place, so a crash (kill -9) at any point
//     leaves the old index: no partial checkpoint is ever listed, and Open
//     removes what the crashed attempt left (Open after "dirty").
//   - Chunks are shared only within one Store (one sandbox), so DiskUsage
//     is exactly what that sandbox's checkpoints cost, and Delete frees
//     every chunk no remaining checkpoint names.
//   - Restore stages the checkpoint beside each target directory, checks
//     every chunk's hash while writing it, and only then swaps: restore.json
//     records the swap before the first rename, and Open finishes a swap it
//     finds recorded (phase "swap") or removes the staging of one that never
//     got there (phase "stage"). A target is always the old tree or the
//     checkpoint's, never a mix. A corrupted chunk fails the restore with
//     ErrCorrupt before anything is swapped.
//   - Regular files, directories and symlinks are captured; sockets, fifos
//     and device nodes are not (they carry no data) and are counted in
//     Info.Skipped. Hard links are captured as separate files.
//   - Create never follows a symlink of the tree, even one swapped in while
//     it walks (the caller freezes the sandbox, but a process running as
//     the same user elsewhere is not frozen): every entry is looked at and
//     opened relative to its directory's descriptor with O_NOFOLLOW, and a
//     file's metadata comes from the descriptor its content is read from.
//     Restore writes into a fresh staging directory it made, never through
//     the old tree.
//   - Create chunks, hashes and compresses on every core (capture.go: one
//     walker in order, then chunkers and hashers over bounded channels),
//     and a snapshot is the same whatever the number of workers: the walk's
//     order, each file's chunks in file order. The freeze ends once every
//     file is read; hashing and compressing go on after the thaw.
//   - Export writes one checkpoint as an archive (docs/archive.md: a
//     versioned header, the snapshot, the chunks the receiver lacks, an end
//     record with a CRC-32C). Import takes an archive whole or not at all:
//     every chunk's hash, the snapshot's hash and shape (checkTree: no path
//     a restore would write outside its directory or through one of its
//     own symlinks), the framing and the limits are checked, and a refused
//     or killed import leaves no chunk and lists nothing (the "dirty" mark,
//     as for Create). A length field is checked before its payload is read
//     and a frame decodes to at most its limit, so a hostile archive costs
//     bounded memory.
//
// Not safe for concurrent use across processes; one Store value
// serializes its own methods (Export and Import hold the store for as
// long as their stream takes).
//
// Files: store.go (the Store, its index, Delete and gc), create.go
// (Create), capture.go (the capture pipeline and walk), restore.go
// (Restore and its swap), tree.go (the shape a tree must have), archive.go
// (the stream's format and Export), import.go (Import and its checks),
// materialize.go (Materialize: a checkpoint written into new directories
// with its owners remapped, what a fork of a sandbox starts from),
// restorefrom.go (RestoreFrom: Restore with the files cloned from a
// snapshot of the tree).
package checkpoint
