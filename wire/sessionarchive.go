package wire

// ContentTypeSessionArchive is the media type of a session archive (GET
// and POST /v1/sandboxes/{name}/session-archive): a POSIX tar stream whose
// first entry is sessions.json (docs/protocol.md, "Session archives").
const ContentTypeSessionArchive = "application/vnd.runner.session-archive+tar"

// SessionImport is the answer of POST
// /v1/sandboxes/{name}/session-archive: the sessions imported, oldest
// first.
type SessionImport struct {
	Sessions []Session `json:"sessions"`
}
