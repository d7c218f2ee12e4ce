package cli

// runner logs --timestamps: each line prefixed with a time the journal
// recorded, never one runner makes up. runnerd's journal keeps a mark
// (offset, time) at the first write at least a second (the granularity)
// after the previous mark; a line's time is the mark at or before its
// first byte, so the line was written at or after that time and within
// the granularity of it.

import (
	"context"
	"fmt"
	"io"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// stampLayout is RFC 3339 with a fixed nine-digit fraction in UTC, so the
// stamps line up (as docker logs --timestamps prints them).
const stampLayout = "2006-01-02T15:04:05.000000000Z"

// noStamp stands where a line has no mark at or before its first byte.
const noStamp = "-"

// stamper writes one stream's bytes to w, each line prefixed with its
// time. It reads the stream's marks from runnerd as the lines need them.
// Not safe for concurrent use.
type stamper struct {
	ctx              context.Context
	e                *env
	c                *client.Client
	name, id, stream string
	w                io.Writer

	pos       int64       // stream offset of the next byte written
	lineStart bool        // the next byte begins a line
	marks     []wire.Mark // from the mark covering the last stamped line on
	fetchedTo int64       // every byte before this had been written when marks were read
	fetched   bool
	noted     bool
	err       error // a marks read that failed; Write returns it
}

func newStamper(ctx context.Context, e *env, c *client.Client, name, id, stream string, w io.Writer, from int64) *stamper {
	return &stamper{ctx: ctx, e: e, c: c, name: name, id: id, stream: stream, w: w, pos: from, lineStart: true}
}

// Write writes p, the bytes at s.pos on, stamping each line that starts
// in it (a line the stream was entered in the middle of is stamped by its
// first byte written here).
func (s *stamper) Write(p []byte) (int, error) {
	chunkEnd := s.pos + int64(len(p))
	n := 0
	for len(p) > 0 {
		if s.lineStart {
			stamp, err := s.stamp(chunkEnd)
			if err != nil {
				return n, err
			}
			if _, err := io.WriteString(s.w, stamp+" "); err != nil {
				return n, err
			}
		}
		line := p
		s.lineStart = false
		for i, b := range p {
			if b == '\n' {
				line, s.lineStart = p[:i+1], true
				break
			}
		}
		m, err := s.w.Write(line)
		n += m
		s.pos += int64(m)
		if err != nil {
			return n, err
		}
		p = p[len(line):]
	}
	return n, nil
}

// stamp is the time of the mark at or before s.pos. The bytes up to
// chunkEnd are in hand, so were written (and marked) before any read made
// now: marks are read again only for a line past every known mark and
// past what the last read covered.
func (s *stamper) stamp(chunkEnd int64) (string, error) {
	if !s.fetched || (s.pos >= s.fetchedTo && (len(s.marks) == 0 || s.marks[len(s.marks)-1].Offset <= s.pos)) {
		if err := s.fetch(chunkEnd); err != nil {
			s.err = err
			return "", err
		}
	}
	i := -1
	for j, m := range s.marks {
		if m.Offset > s.pos {
			break
		}
		i = j
	}
	if i < 0 {
		if !s.noted {
			s.noted = true
			fmt.Fprintf(s.e.io.err, "runner: logs: %s: lines before the journal's first mark have no time (%q): the journal records none for them\n", s.stream, noStamp)
		}
		return noStamp, nil
	}
	s.marks = s.marks[i:]
	return s.marks[0].Time.UTC().Format(stampLayout), nil
}

// fetch reads the marks from the one covering s.pos, paging on while the
// next page still starts at or before s.pos.
func (s *stamper) fetch(chunkEnd int64) error {
	from := s.pos
	for {
		ctx, cancel := s.e.callCtx(s.ctx)
		m, err := s.c.Marks(ctx, s.name, s.id, s.stream, from)
		cancel()
		if err != nil {
			return err
		}
		s.marks = m.Marks
		if m.Next == nil || *m.Next > s.pos {
			break
		}
		from = *m.Next
	}
	s.fetched, s.fetchedTo = true, chunkEnd
	return nil
}
