package journal

import (
	"context"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// SendTo writes the next n bytes of the stream, from the Reader's offset,
// to w, and advances the offset by what it wrote. It returns n, nil, or
// fewer bytes and an error.
//
// Bytes already in the segment files go to w as an *io.LimitedReader over
// the segment's *os.File, positioned at the offset and limited to what the
// segment held when SendTo looked (and, for a follow Reader that has seen
// the exit record, to the final length): so a w whose ReadFrom takes that
// form, a *net.TCPConn or the http.ResponseWriter over one, copies them
// with sendfile(2), without passing through user space. Either way SendTo
// never sends a byte a Read at the same moment would not have returned.
//
// Where no byte is on disk at the offset it reads as ReadContext does: a
// follow Reader waits for bytes (or ctx), and every error ReadContext
// returns is SendTo's too (ErrTruncated in a *CursorError, ErrLost,
// ErrCorrupt, ctx.Err()). The end of the stream (io.EOF from
// ReadContext) before n bytes is io.ErrUnexpectedEOF. An error writing to
// w is returned wrapped.
func (r *Reader) SendTo(ctx context.Context, w io.Writer, n int64) (int64, error) {
	if r.closed {
		return 0, ErrClosed
	}
	var sent int64
	var buf []byte // for the bytes ReadContext returns after a wait
	for sent < n {
		k, err := r.avail()
		if err != nil {
			return sent, err
		}
		if r.exitKnown {
			k = min(k, r.exitLen-r.off)
		}
		k = min(k, n-sent)
		if k <= 0 {
			// Nothing on disk at the offset (the live end, or the final
			// length): ReadContext waits or says how the stream ended.
			if buf == nil {
				buf = make([]byte, 32<<10)
			}
			m, err := r.ReadContext(ctx, buf[:min(int64(len(buf)), n-sent)])
			if m > 0 {
				wm, werr := w.Write(buf[:m])
				sent += int64(wm)
				if werr != nil {
					return sent, fmt.Errorf("send %s: %w", r.stream, werr)
				}
				continue
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return sent, err
		}
		// ReadContext uses ReadAt, so the file position is SendTo's alone.
		if _, err := r.f.Seek(r.off-r.base, io.SeekStart); err != nil {
			return sent, fmt.Errorf("seek segment: %w", err)
		}
		c, err := io.Copy(w, &io.LimitedReader{R: r.f, N: k})
		r.off += c
		sent += c
		if err != nil {
			return sent, fmt.Errorf("send %s: %w", r.stream, err)
		}
		if c == 0 {
			// The file says it has k bytes here and yields none: never
			// loop on it.
			return sent, fmt.Errorf("%w: segment of %s at %d reads short of its size", ErrCorrupt, r.stream, r.off)
		}
	}
	return sent, nil
}

// avail returns how many bytes the segment holding r.off has from r.off
// on, after moving to that segment if the writer rolled; 0 at the live end.
func (r *Reader) avail() (int64, error) {
	for {
		var st unix.Stat_t
		if err := unix.Fstat(int(r.f.Fd()), &st); err != nil {
			return 0, fmt.Errorf("stat segment: %w", err)
		}
		if k := st.Size - (r.off - r.base); k > 0 {
			return k, nil
		}
		if moved, err := r.advance(); err != nil || !moved {
			return 0, err
		}
	}
}
