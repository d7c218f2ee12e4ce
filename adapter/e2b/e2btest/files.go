package e2btest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// fileError writes envd's Error schema ({code, message}).
func fileError(w http.ResponseWriter, status int, msg string) { envdJSONError(w, status, msg) }

// files serves envd's GET and POST /files inside the sandbox's directory,
// which stands for the user's home. Paths are confined with os.Root, so
// neither "..", an absolute path outside the directory nor a symlink
// reaches the host: an absolute path must lie inside the sandbox
// directory (a stand-in limit; real envd sees the guest's whole tree,
// writes as root and chowns to the user). Answers are envd's: an upload
// is 200 with its JSON list of entries and no declared type (Go sniffs
// text/plain), a missing file 404 "path '...' does not exist".
func (s *Server) files(w http.ResponseWriter, r *http.Request, sb *sandbox, u user) {
	path := r.URL.Query().Get("path")
	if path == "" {
		fileError(w, http.StatusBadRequest, "path is required")
		return
	}
	rel := path
	if filepath.IsAbs(path) {
		var err error
		if rel, err = filepath.Rel(sb.dir, path); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			fileError(w, http.StatusBadRequest, "path outside the sandbox: "+path)
			return
		}
	}
	root, err := os.OpenRoot(sb.dir)
	if err != nil {
		fileError(w, http.StatusInternalServerError, "open sandbox directory")
		return
	}
	defer root.Close()
	switch r.Method {
	case http.MethodGet:
		f, err := root.Open(rel)
		if errors.Is(err, fs.ErrNotExist) {
			fileError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", filepath.Join(sb.dir, rel)))
			return
		}
		if err != nil {
			fileError(w, http.StatusBadRequest, "invalid path: "+path)
			return
		}
		defer f.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = io.Copy(w, f)
	case http.MethodPost:
		mr, err := r.MultipartReader()
		if err != nil {
			fileError(w, http.StatusBadRequest, "expected multipart/form-data")
			return
		}
		part, err := mr.NextPart()
		if err != nil || part.FormName() != "file" {
			fileError(w, http.StatusBadRequest, "expected a file part")
			return
		}
		// Directories it makes and the file are the user's, as envd
		// chowns them.
		var made []string
		for d := filepath.Dir(rel); d != "."; d = filepath.Dir(d) {
			if _, err := root.Lstat(d); errors.Is(err, fs.ErrNotExist) {
				made = append(made, d)
			}
		}
		if dir := filepath.Dir(rel); dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				fileError(w, http.StatusBadRequest, "invalid path: "+path)
				return
			}
		}
		for _, d := range made {
			_ = u.own(filepath.Join(sb.dir, d))
		}
		f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			fileError(w, http.StatusBadRequest, "invalid path: "+path)
			return
		}
		_, cerr := io.Copy(f, part)
		if err := f.Close(); cerr == nil {
			cerr = err
		}
		if cerr == nil {
			cerr = u.own(filepath.Join(sb.dir, rel))
		}
		if cerr != nil {
			fileError(w, http.StatusInternalServerError, "write file: "+cerr.Error())
			return
		}
		b, _ := json.Marshal([]map[string]string{{"path": filepath.Join(sb.dir, rel), "name": filepath.Base(rel), "type": "file"}})
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}
