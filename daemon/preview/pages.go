package preview

import (
	"html/template"
	"net/http"
	"strconv"

	"github.com/agentrunner/runner/wire"
)

// A page is what a browser shows when the Server answers by itself. Pages
// name the sandbox and its port at most: never a token, never the host's
// addresses.
type page struct {
	Title string
	Text  string
}

var (
	pageNotFound = page{
		Title: "Preview not found",
		Text:  "This preview does not exist. The link may be mistyped, or the preview was revoked, or its sandbox was destroyed.",
	}
	pageNotServing = page{
		Title: "Sandbox port not serving",
		Text:  "The sandbox's port is not serving: nothing is listening on it. Start the server inside the sandbox, then reload this page.",
	}
	pageBadGateway = page{
		Title: "Sandbox port did not answer",
		Text:  "The sandbox's port did not give a valid answer. Check the server inside the sandbox, then reload this page.",
	}
	pageUnavailable = page{
		Title: "Preview temporarily unavailable",
		Text:  "The runner could not look this preview up just now. Reload this page in a moment.",
	}
	pageLoop = page{
		Title: "Preview loop",
		Text:  "This request came back to the preview server through a preview: the sandbox's port forwards to a preview URL. The runner refuses to proxy it again.",
	}
	pageClosing = page{
		Title: "Preview server stopping",
		Text:  "The runner's preview server is stopping. Reload this page in a moment.",
	}
)

var pageHTML = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>{{.Title}}</title></head>
<body>
<h1>{{.Title}}</h1>
<p>{{.Text}}</p>
{{- if .Sandbox}}
<p>Sandbox: {{.Sandbox}}{{if .Port}}, port {{.Port}}{{end}}</p>
{{- end}}
</body>
</html>
`))

// writePage answers with one of the Server's own pages, about target when it
// is not nil.
func writePage(w http.ResponseWriter, status int, p page, target *Target) {
	data := struct {
		page
		Sandbox, Port string
	}{page: p}
	if target != nil {
		data.Sandbox = target.Sandbox
		if target.Addr.Port() != 0 {
			data.Port = strconv.Itoa(int(target.Addr.Port()))
		}
	}
	h := w.Header()
	// The page is for a browser; the header is for a program, with the
	// code runnerd's API uses (docs/protocol.md, POST .../urls).
	code := wire.CodeUnavailable // 502, 503: try again later
	switch status {
	case http.StatusNotFound:
		code = wire.CodeNotFound // the token is unknown or revoked
	case http.StatusLoopDetected:
		code = wire.CodeInvalid
	}
	h.Set(wire.HeaderError, string(code))
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'none'")
	w.WriteHeader(status)
	_ = pageHTML.Execute(w, data)
}
