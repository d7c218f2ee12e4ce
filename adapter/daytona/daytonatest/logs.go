package daytonatest

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The formats of a log answer, chosen by the SDK version header and
// X-Daytona-Split-Output as the daemon's IsCombinedOutput and
// SkipServerDemux choose them.
const (
	// formatCombined: plain text, every marker sequence removed (no SDK
	// version and no split header; or an SDK older than 0.27.0).
	formatCombined = iota
	// formatSplit: plain text with the markers (no SDK version and
	// X-Daytona-Split-Output: true; or an SDK from 0.27.0 to before
	// 0.167.0).
	formatSplit
	// formatJSON: {output, stdout, stderr} (an SDK from 0.167.0, or a
	// dev version); JSON replaces invalid UTF-8 with U+FFFD.
	formatJSON
)

func logFormat(h http.Header) int {
	v := h.Get("X-Daytona-SDK-Version")
	if v == "" {
		if h.Get("X-Daytona-Split-Output") == "true" {
			return formatSplit
		}
		return formatCombined
	}
	if strings.Contains(v, "dev") {
		return formatJSON
	}
	cmp27, ok27 := compareVersion(v, [3]int{0, 27, 0})
	if ok27 && cmp27 < 0 {
		return formatCombined
	}
	if cmp167, ok := compareVersion(v, [3]int{0, 167, 0}); !ok || cmp167 < 0 {
		return formatSplit
	}
	return formatJSON
}

// compareVersion compares X.Y.Z[-pre] with want-0 (the lowest
// pre-release of want): -1, 0 or 1, and false when v does not parse.
func compareVersion(v string, want [3]int) (int, bool) {
	v = strings.TrimPrefix(v, "v")
	core, pre, hasPre := strings.Cut(v, "-")
	if !hasPre {
		// "1.2.3rc1": the daemon dashes a suffix glued to the core.
		for i := len(core) - 1; i >= 0; i-- {
			if core[i] >= '0' && core[i] <= '9' {
				core, pre, hasPre = core[:i+1], core[i+1:], i+1 < len(core)
				break
			}
		}
	}
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return 0, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return 0, false
		}
		if n != want[i] {
			if n < want[i] {
				return -1, true
			}
			return 1, true
		}
	}
	// Equal cores: want-0 is below every other pre-release of it and
	// below the release.
	if hasPre && pre == "0" {
		return 0, true
	}
	return 1, true
}

func stripMarkers(b []byte) []byte {
	return bytes.ReplaceAll(bytes.ReplaceAll(b, stdoutMarker, nil), stderrMarker, nil)
}

// demux splits a split log into its streams: the bytes after each marker
// up to the next marker of either kind; bytes before the first marker are
// dropped.
func demux(b []byte) (stdout, stderr []byte) {
	var cur *[]byte
	for len(b) > 0 {
		switch {
		case bytes.HasPrefix(b, stdoutMarker):
			cur, b = &stdout, b[3:]
			continue
		case bytes.HasPrefix(b, stderrMarker):
			cur, b = &stderr, b[3:]
			continue
		}
		if cur != nil {
			*cur = append(*cur, b[0])
		}
		b = b[1:]
	}
	return stdout, stderr
}

func (s *Server) logs(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) {
	s.mu.Lock()
	_, c, ok := lookupCommand(w, r, sb, sid, cid)
	s.mu.Unlock()
	if !ok {
		return
	}
	if r.Header.Get("Upgrade") == "websocket" {
		// Follow is a WebSocket on the daemon; the stand-in serves only
		// the HTTP log.
		typedError(w, r, http.StatusBadRequest, "bad request: the stand-in serves no websocket")
		return
	}
	b, err := os.ReadFile(filepath.Join(c.dir, "output.log"))
	if err != nil {
		typedError(w, r, http.StatusNotFound, "not found: "+err.Error())
		return
	}
	switch logFormat(r.Header) {
	case formatJSON:
		o, e := demux(b)
		writeJSON(w, http.StatusOK, map[string]string{"output": string(b), "stdout": string(o), "stderr": string(e)})
		return
	case formatCombined:
		b = stripMarkers(b)
	}
	// Plain text keeps the bytes as they are, invalid UTF-8 included.
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}
