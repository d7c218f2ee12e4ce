package sandboxes

// The /etc/passwd and /etc/group an isolated sandbox's commands read.
//
// A sandbox with an identity of its own (a uid and gid from runnerd's
// range) has no entry in the host's user database, so everything that
// asks it for the current user fails: whoami, bash's prompt ("I have no
// name!"), ssh, Python's pwd.getpwuid, git's default identity. runnerd
// writes a copy of the host's two files with one entry added, the user
// "sandbox" with the sandbox's uid and gid, its workspace as home, into
// the sandbox's private directory, and binds them read-only over the
// host's in the command's mount namespace (sessiondir.Bind ReadOnly), where the
// private /tmp is bound already. The host's files are never changed. The
// copy is made when the private directory is (create, or the first spawn
// of an older sandbox) and kept: a host user added later is not seen by
// existing sandboxes.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/internal/atomicfile"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// sandboxUser is the name of an isolated sandbox's own user and group.
const sandboxUser = "sandbox"

// userFiles are the files of the user database a sandbox gets a copy of:
// the name in its private directory and the host's path.
var userFiles = []sessiondir.Bind{{Source: "passwd", Target: "/etc/passwd", ReadOnly: true}, {Source: "group", Target: "/etc/group", ReadOnly: true}}

// withSandboxUser returns the host's passwd (group when group is true)
// content with any entry of the name sandboxUser or of the id removed and
// the sandbox's entry appended. Lines it cannot parse are kept as they
// are.
func withSandboxUser(host []byte, group bool, uid, gid uint32, home, shell string) []byte {
	id := strconv.FormatUint(uint64(uid), 10)
	entry := fmt.Sprintf("%s:x:%d:%d:%s:%s:%s\n", sandboxUser, uid, gid, sandboxUser, home, shell)
	if group {
		id = strconv.FormatUint(uint64(gid), 10)
		entry = fmt.Sprintf("%s:x:%d:\n", sandboxUser, gid)
	}
	var out bytes.Buffer
	for line := range bytes.Lines(host) {
		f := bytes.SplitN(bytes.TrimRight(line, "\n"), []byte(":"), 4)
		if len(f) >= 3 && (string(f[0]) == sandboxUser || string(f[2]) == id) {
			continue
		}
		out.Write(line)
		if !bytes.HasSuffix(line, []byte("\n")) {
			out.WriteByte('\n')
		}
	}
	out.WriteString(entry)
	return out.Bytes()
}

// sandboxShell is the login shell of the sandbox's entry: bash where the
// host has it (an interactive exec then gets its prompt), else sh.
func sandboxShell() string {
	if _, err := os.Stat("/bin/bash"); err == nil {
		return "/bin/bash"
	}
	return "/bin/sh"
}

// writeUserFiles writes sb's copies of the host's passwd and group into
// its private directory dir, unless they exist. A host without one of the
// files gets no copy of it (nothing to bind over).
func writeUserFiles(sb registry.Sandbox, dir string) error {
	if sb.Identity == nil {
		return nil
	}
	for _, f := range userFiles {
		p := filepath.Join(dir, f.Source)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		host, err := os.ReadFile(f.Target)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", f.Target, err)
		}
		b := withSandboxUser(host, f.Source == "group", sb.Identity.UID, sb.Identity.GID, sb.Workspace, sandboxShell())
		if err := atomicfile.WriteFile(p, b, 0o644); err != nil {
			return fmt.Errorf("%s: %w", f.Target, err)
		}
	}
	return nil
}

// userBinds returns the binds of sb's copies in its private directory dir
// over the host's files: none for a sandbox without an identity of its
// own, or for a file the copy lacks (writeUserFiles makes a copy only of
// a file the host has).
func userBinds(sb registry.Sandbox, dir string) []sessiondir.Bind {
	if sb.Identity == nil {
		return nil
	}
	var binds []sessiondir.Bind
	for _, f := range userFiles {
		src := filepath.Join(dir, f.Source)
		if _, err := os.Lstat(src); err != nil {
			continue
		}
		binds = append(binds, sessiondir.Bind{Source: src, Target: f.Target, ReadOnly: true})
	}
	return binds
}
