// Package journal stores a session's output streams on disk and serves
// them to any number of readers, live or replaying, from a byte cursor.
// The journal is the stream: output has one path (command → shim → segment
// files → readers), so "replay from cursor N" and "what I missed while
// disconnected" are byte-exact by construction.
//
// # Roles
//
// Exactly one Writer (the shim) appends; it is made by Create and, after a
// crash or Close, by Recover. Any number of Journal handles in any process
// read through Readers. Readers never take a lock that blocks the writer and
// never open index.db while the writer lives.
//
// # On-disk format
//
//	DIR/index.db                         bbolt index, held open by the writer for its life
//	DIR/<stream>/<first offset>.seg      raw bytes, first offset as 20 decimal digits
//	DIR/journal.json                     streams and segment size, written once by Create
//	DIR/exit.json                        exit record (type Exit), published last
//
// A segment file holds exactly the stream's bytes from its first offset, so
// cat of a stream's segments in name order is the stream, and
// Reader.SendTo can hand a range of it to sendfile(2) segment by segment. A segment is
// sealed when it reaches Options.SegmentBytes; its successor is named by the
// offset at which it ends. Segments are aligned (each starts at a multiple
// of SegmentBytes, also after Recover), so a reader maps a cursor to its
// segment by arithmetic with the segment size from journal.json: time to
// first byte does not depend on the journal's size. index.db holds the options, the synced length
// and first retained offset of each stream, its segments, offset↔time marks
// (one per MarkInterval of writing, keyed by wall-clock nanoseconds) and the
// exit record; see format.go for the keys.
//
// The writer's exclusive flock on index.db is its liveness lock: a reader
// that can take a shared non-blocking lock knows no writer is alive. Create
// renames index.db into place already locked, so a live journal is never
// seen unlocked. When the writer dies the kernel closes index.db, which
// followers see as IN_CLOSE_WRITE.
//
// # Invariants
//
//   - Segments of a stream are contiguous: each starts where the previous
//     one ends; the first is the first retained offset.
//   - Bytes are only appended. Retention removes whole sealed segments,
//     oldest first, on a segment roll; a reader whose cursor falls behind
//     gets ErrTruncated, never a silent skip.
//   - exit.json is renamed in only after every byte is written and synced
//     and the exit record is committed to the index, and before index.db is
//     released. So a follower that finds the writer gone and no exit.json
//     knows the writer was lost, and one that finds exit.json ends exactly at
//     its Lengths.
//   - A reader never sees a byte change once read: Recover on the same boot
//     keeps every byte in the files.
//
// # Durability and fsync policy
//
// Write is one write(2) per segment touched, with no user-space buffer:
// when it returns, the bytes are in the page cache, visible to readers and
// safe from a kill -9 of the writer. Against power loss, bytes are durable
// at sync points: every SyncInterval (default 1 s) a background goroutine
// fsyncs the segments written since the last sync (sealed ones too, off the
// write path), fsyncs stream directories that gained or lost segments, and
// then commits the synced lengths to index.db (a bbolt transaction, itself
// fsynced). Sync does the same on demand; Finish and Close do it last.
// A sync point with nothing written costs nothing. Recover after a reboot
// cuts each stream back to the last committed length, so what survives a
// power loss is a prefix of what was written, never garbage.
//
// Create fsyncs the new directories, journal.json and index.db before it
// returns, unless Options.DeferCreateSync is set (the shim sets it: those
// fsyncs were most of a spawn's journal cost and sat before its
// acknowledgement). Then the first sync point (at most one SyncInterval
// later, or Sync, Finish, Close) makes them durable with the first bytes,
// and a power loss before it can lose the whole journal, which is empty
// but for at most one interval of output, exactly what a power loss loses
// of any journal. What it can leave, and what Recover makes of it: no
// journal directory or no index.db (Recover returns an error matching
// fs.ErrNotExist and creates nothing; runnerd records the session as lost,
// "never started"); an index.db that is empty or holds only bbolt's
// initial pages (Recover recreates a clean empty journal with the streams
// journal.json or the stream directories name, which runnerd then finishes
// as lost); a torn index.db (ErrCorrupt; runnerd records lost).
// docs/benchmarks.md measures the cost.
//
// # Memory
//
// The writer keeps O(retained segments) offsets plus the marks of one sync
// interval; marks live in index.db. A Reader keeps one open segment and,
// once it waits, either a registration with a shared Watcher or an inotify
// descriptor of its own with a 1 KiB event buffer, whatever the stream's
// size.
//
// # Waiting
//
// A follow Reader waits with inotify on its stream directory and the
// journal directory, never a sleep loop, and registers before it checks
// the files, so no change is missed. The kernel limits inotify instances
// per user (fs.inotify.max_user_instances, 128 by default, shared by every
// process of the user), so a process following many streams shares one
// Watcher (one instance, one goroutine, one watch per directory) through
// Journal.NewReaderWatched; NewReader gives a Reader its own instance. If
// the kernel refuses an instance or a watch, the Reader polls every
// DefaultPollInterval (or WatcherOptions.PollInterval): slower, never
// wrong, and reported through WatcherOptions.OnPoll.
//
// # Files
//
// The Writer is cut by role: writer.go (Create, Relocate, the write path),
// sync.go (the syncer and index commits), finish.go (Finish and Close),
// reserve.go (the reserve file Finish uses on a full disk).
package journal
