package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/internal/atomicfile"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// prepare makes what a session needs before it knows its command, in dir:
// the control socket (listening), the journal (opts) and the pid file.
// A warm shim prepares a staging directory ahead of time (moveTo then
// renames it into place); a cold start prepares the session directory.
// On failure what it made is removed; on success undo removes it.
func prepare(dir string, opts journal.Options) (_ *server, err error) {
	s := &server{dir: dir, exited: make(chan struct{}), done: make(chan struct{}), closing: make(chan struct{}),
		stdinTurn: make(chan struct{}, 1), conns: map[*net.UnixConn]struct{}{}, atLineStart: true}
	defer func() {
		if err != nil {
			s.undo()
		}
	}()
	if s.sock, err = sessiondir.SocketPath(dir); err != nil {
		return nil, err
	}
	os.Remove(s.sock) // a stale socket of a crashed attempt
	s.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: s.sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on control socket: %w", err)
	}
	s.ln.SetUnlinkOnClose(false) // removed explicitly, after the exit record
	s.closers = append(s.closers, func() { s.ln.Close(); os.Remove(s.sock) })

	if err := s.createJournal(opts); err != nil {
		return nil, err
	}
	if s.startedFile, err = createPending(dir, sessiondir.StartedFile); err != nil {
		return nil, fmt.Errorf("create %s: %w", sessiondir.StartedFile, err)
	}
	s.closers = append(s.closers, func() { s.startedFile.discard(s.dir) })
	pidFile := func() string { return filepath.Join(s.dir, sessiondir.PIDFile) }
	if err := atomicfile.WriteFile(pidFile(), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("write pid file: %w", err)
	}
	s.closers = append(s.closers, func() { os.Remove(pidFile()) })
	return s, nil
}

// createJournal creates the session's journal in s.dir; undo removes it.
func (s *server) createJournal(opts journal.Options) error {
	jw, err := journal.Create(filepath.Join(s.dir, sessiondir.JournalDir), opts)
	if err != nil {
		return fmt.Errorf("create journal: %w", err)
	}
	s.jw.Store(jw)
	s.closers = append(s.closers, func() {
		if jw := s.jw.Load(); jw != nil {
			jw.Close()
		}
		os.RemoveAll(filepath.Join(s.dir, sessiondir.JournalDir))
	})
	return nil
}

// stage makes what a warm shim prepares beyond prepare: spec.json,
// created empty under its temporary name, for adopt to fill.
func (s *server) stage() (err error) {
	if s.specFile, err = createPending(s.dir, sessiondir.SpecFile); err != nil {
		return fmt.Errorf("create %s: %w", sessiondir.SpecFile, err)
	}
	s.closers = append(s.closers, func() { s.specFile.discard(s.dir) })
	return nil
}

// moveTo renames the prepared (staging) directory to dir, which must not
// exist yet, and makes s the shim of dir: the listening socket, the
// journal and the pid file move with it, by inode.
func (s *server) moveTo(dir string) error {
	sock, err := sessiondir.SocketPath(dir)
	if err != nil {
		return err
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%w: session directory %q is not absolute", sessiondir.ErrInvalid, dir)
	}
	err = unix.Renameat2(unix.AT_FDCWD, s.dir, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) {
		// A file system without RENAME_NOREPLACE: check, then rename.
		if _, err = os.Lstat(dir); err == nil {
			err = unix.EEXIST
		} else if errors.Is(err, fs.ErrNotExist) {
			err = os.Rename(s.dir, dir)
		}
	}
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return fmt.Errorf("start shim %s: %w", dir, sessiondir.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("move staged session to %s: %w", dir, err)
	}
	s.dir, s.sock = dir, sock
	return s.jw.Load().Relocate(filepath.Join(dir, sessiondir.JournalDir))
}

// adopt makes the moved directory spec's session: it writes spec.json
// and, when spec needs another journal than the one staged (a TTY has one
// stream; another retention), replaces the journal.
func (s *server) adopt(spec sessiondir.Spec, staged journal.Options) error {
	b, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("%w: encode spec: %v", sessiondir.ErrInvalid, err)
	}
	if err := s.specFile.publish(s.dir, b); err != nil {
		return fmt.Errorf("write spec: %w", err)
	}
	want := journalOptions(spec, true)
	if slices.Equal(want.Streams, staged.Streams) && want.RetainBytes == staged.RetainBytes {
		return nil
	}
	s.jw.Load().Close()
	jdir := filepath.Join(s.dir, sessiondir.JournalDir)
	if err := os.RemoveAll(jdir); err != nil {
		return fmt.Errorf("replace staged journal: %w", err)
	}
	jw, err := journal.Create(jdir, want)
	if err != nil {
		return fmt.Errorf("create journal: %w", err)
	}
	s.jw.Store(jw)
	return nil
}

// undo removes what prepare and start made, last first. Only for a
// server whose command never started (or was killed by start).
func (s *server) undo() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// pendingFile is a file created before its content is known, under a
// temporary name (NAME.tmp): publish writes the content and renames it
// into place, so a reader sees all of it or no file. A warm shim creates
// its session's files this way ahead of time, off the start's path.
type pendingFile struct {
	name string
	f    *os.File // nil once published or discarded
}

func createPending(dir, name string) (*pendingFile, error) {
	f, err := os.OpenFile(filepath.Join(dir, name+".tmp"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	return &pendingFile{name: name, f: f}, nil
}

// publish writes b and renames the file to dir/NAME; dir is where the
// file is now (its directory may have been renamed since it was created).
func (p *pendingFile) publish(dir string, b []byte) error {
	_, err := p.f.Write(b)
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	p.f = nil
	tmp := filepath.Join(dir, p.name+".tmp")
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, p.name))
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// discard removes an unpublished file.
func (p *pendingFile) discard(dir string) {
	if p.f != nil {
		p.f.Close()
		p.f = nil
		os.Remove(filepath.Join(dir, p.name+".tmp"))
	}
}
