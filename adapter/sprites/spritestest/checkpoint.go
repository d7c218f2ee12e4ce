package spritestest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// Checkpoints, from superfly/sprites-go (checkpoint.go, types.go) and
// the checkpoints concept page: POST …/checkpoint {comment} streams NDJSON
// progress ({type, data}) and names the checkpoint ("v0", "v1", …) only
// in the last event's text; GET …/checkpoints is a bare array of {id,
// create_time, comment}; GET …/checkpoints/{id} one of them (404
// otherwise); POST …/checkpoints/{id}/restore streams progress too and
// is asynchronous: the sprite restarts (every process ends) and refuses
// execs for Options.ReadyDelay. A checkpoint is a copy of the sprite's
// files (sockets and the /.sprite management directory left out), with
// the digest of that copy: a restore verifies it first and refuses a
// damaged checkpoint (an "error" progress event) with the sprite
// untouched, as a provider that keeps its snapshots checksummed does;
// CorruptCheckpoint damages one, for the conformance suite's step.

type checkpoint struct {
	id      string
	comment string
	created time.Time
	dir     string
	sum     string // treeDigest of dir when it was made
}

func (s *Server) createCheckpoint(w http.ResponseWriter, r *http.Request) {
	sp, ok := s.lookupReady(w, r)
	if !ok {
		return
	}
	var body struct {
		Comment string `json:"comment"`
	}
	if b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20)); len(b) > 0 && json.Unmarshal(b, &body) != nil {
		apiError(w, http.StatusBadRequest, "invalid_request", "invalid body")
		return
	}
	s.mu.Lock()
	id := "v" + strconv.Itoa(len(sp.checkpoints))
	s.mu.Unlock()
	dst := filepath.Join(s.root, ".checkpoints", sp.id, id)
	progress := ndjson(w)
	progress("info", "Creating checkpoint...")
	if err := copyTree(sp.dir, dst); err != nil {
		_ = os.RemoveAll(dst)
		progress("error", "checkpoint failed")
		return
	}
	sum, err := treeDigest(dst)
	if err != nil {
		_ = os.RemoveAll(dst)
		progress("error", "checkpoint failed")
		return
	}
	s.mu.Lock()
	sp.checkpoints = append(sp.checkpoints, checkpoint{id: id, comment: body.Comment, created: time.Now().UTC(), dir: dst, sum: sum})
	s.mu.Unlock()
	progress("info", "Checkpoint created: "+id)
}

func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request) {
	sp, ok := s.lookup(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	out := []map[string]any{}
	for _, c := range sp.checkpoints {
		out = append(out, checkpointView(c))
	}
	s.mu.Unlock()
	standin.WriteJSON(w, http.StatusOK, out)
}

func checkpointView(c checkpoint) map[string]any {
	v := map[string]any{"id": c.id, "create_time": c.created.Format(time.RFC3339Nano)}
	if c.comment != "" {
		v["comment"] = c.comment
	}
	return v
}

func (s *Server) findCheckpoint(w http.ResponseWriter, sp *sprite, id string) (checkpoint, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range sp.checkpoints {
		if c.id == id {
			return c, true
		}
	}
	apiError(w, http.StatusNotFound, "checkpoint_not_found", "checkpoint not found")
	return checkpoint{}, false
}

func (s *Server) getCheckpoint(w http.ResponseWriter, r *http.Request) {
	sp, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if c, ok := s.findCheckpoint(w, sp, r.PathValue("id")); ok {
		standin.WriteJSON(w, http.StatusOK, checkpointView(c))
	}
}

func (s *Server) restoreCheckpoint(w http.ResponseWriter, r *http.Request) {
	sp, ok := s.lookup(w, r)
	if !ok {
		return
	}
	c, ok := s.findCheckpoint(w, sp, r.PathValue("id"))
	if !ok {
		return
	}
	progress := ndjson(w)
	progress("info", "Restoring to "+c.id+"...")
	if sum, err := treeDigest(c.dir); err != nil || sum != c.sum {
		// Verified before anything is touched: the sprite keeps running
		// on its disk as it is.
		progress("error", "checkpoint "+c.id+" failed verification; restore refused")
		return
	}
	// The environment restarts: every process ends, its exec included.
	s.mu.Lock()
	for _, p := range sp.procs {
		p.killLocked()
	}
	sp.life.tasks = map[string]task{}
	sp.readyAt = time.Now().Add(s.opts.ReadyDelay)
	s.mu.Unlock()
	signalSprite(sp.id, syscall.SIGKILL)
	signalSprite(sp.id, syscall.SIGCONT)
	if err := replaceTree(sp.dir, c.dir); err != nil {
		progress("error", "restore failed")
		return
	}
	progress("info", "Restored to "+c.id)
}

// ndjson starts a 200 NDJSON answer and returns its event writer.
func ndjson(w http.ResponseWriter) func(typ, data string) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	return func(typ, data string) {
		_ = enc.Encode(map[string]string{"type": typ, "data": data})
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
}

// copyTree copies src's directories, regular files and symlinks to dst,
// leaving out sockets and src/.sprite.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed while walking (a session's socket)
			}
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if rel == ".sprite" {
			return filepath.SkipDir
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return nil
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(to, info.Mode().Perm()|0o700)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.Type().IsRegular():
			return copyFile(path, to, info.Mode().Perm())
		}
		return nil // sockets, fifos
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, perm)
}

// replaceTree empties dir (but for its .sprite) and copies from into it.
func replaceTree(dir, from string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() == ".sprite" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("clear %s: %w", e.Name(), err)
		}
	}
	return copyTree(from, dir)
}

// treeDigest hashes a checkpoint's tree: every entry's path, type and
// permissions, a file's bytes, a link's target, in walk (lexical) order.
func treeDigest(dir string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%q %v\n", rel, info.Mode())
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "-> %q\n", target)
		case d.Type().IsRegular():
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(h, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// CorruptCheckpoint damages checkpoint id of sprite name as stored (one
// byte of every file flipped, or a stray file where it holds none), so
// that its restore is refused. The conformance suite's checkpoint step
// uses it.
func (s *Server) CorruptCheckpoint(name, id string) error {
	s.mu.Lock()
	sp, ok := s.sprites[name]
	var c checkpoint
	found := false
	if ok {
		for _, x := range sp.checkpoints {
			if x.id == id {
				c, found = x, true
			}
		}
	}
	s.mu.Unlock()
	if !found {
		return fmt.Errorf("no checkpoint %q of sprite %q", id, name)
	}
	damaged := 0
	err := filepath.WalkDir(c.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil || len(b) == 0 {
			return err
		}
		b[0] ^= 0xff
		damaged++
		return os.WriteFile(path, b, 0o600)
	})
	if err == nil && damaged == 0 {
		err = os.WriteFile(filepath.Join(c.dir, ".corrupted"), []byte("x"), 0o600)
	}
	return err
}
