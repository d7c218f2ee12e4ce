package journal

import (
	"errors"
	"fmt"
)

var (
	// ErrTruncated is returned when a cursor lies before the first byte the
	// journal still retains (retention removed the segment holding it), by
	// NewReader for such a cursor and by Reader.ReadContext when retention
	// removes the segment a slow reader was about to read. It is always
	// wrapped in a *CursorError.
	ErrTruncated = errors.New("journal: cursor before retained data")

	// ErrInvalidCursor is returned by NewReader when a cursor lies beyond
	// the current end of the stream (or is negative). It is always wrapped in
	// a *CursorError.
	ErrInvalidCursor = errors.New("journal: cursor beyond end of stream")

	// ErrLost is returned by a follow Reader when it has read every byte of a
	// stream whose writer is gone without an exit record (it crashed, was
	// killed, or closed without Finish). A later Recover may continue the
	// journal; a new Reader then sees the new bytes.
	ErrLost = errors.New("journal: writer gone without an exit record")

	// ErrFinished is returned by Writer methods that modify the journal after
	// Finish, and by Recover for a journal that already has an exit record.
	ErrFinished = errors.New("journal: journal is finished")

	// ErrBusy is returned when the journal's index is held by a live writer:
	// by Journal.OffsetAt (ask the writer instead) and by Recover (another
	// writer is alive).
	ErrBusy = errors.New("journal: index held by a live writer")

	// ErrExists is returned by Create when dir already holds a journal.
	ErrExists = errors.New("journal: journal already exists")

	// ErrClosed is returned by Writer, Journal and Reader methods called
	// after Close.
	ErrClosed = errors.New("journal: closed")

	// ErrUnknownStream is returned when a stream name is not one of the
	// journal's streams.
	ErrUnknownStream = errors.New("journal: unknown stream")

	// ErrCorrupt is returned by Recover and by readers when the segment files
	// contradict each other or the index (a gap or overlap between segments,
	// fewer bytes on disk than the index recorded as synced).
	ErrCorrupt = errors.New("journal: corrupt")
)

// CursorError reports a cursor outside the retained range [Start, End] of a
// stream. Err is ErrTruncated or ErrInvalidCursor; match with errors.Is.
type CursorError struct {
	Stream string
	Cursor int64
	Start  int64 // first retained offset
	End    int64 // current end of the stream
	Err    error
}

func (e *CursorError) Error() string {
	return fmt.Sprintf("%v: stream %s cursor %d, retained [%d, %d]", e.Err, e.Stream, e.Cursor, e.Start, e.End)
}

func (e *CursorError) Unwrap() error { return e.Err }
