// Package preview is the preview listener: the HTTP front door that gives each
// sandbox port a URL a person can open in a browser with no platform account.
//
// It backs the url-or-nothing requirement. runnerd runs a Server only when an
// operator configures a URL template; without one the capability is not
// advertised and the URL endpoint answers not_supported (advertise or refuse,
// never pretend).
//
// # How a request is routed
//
// A preview URL is formed from the operator's template by putting a token in
// the first DNS label of the host, for example
//
//	http://{token}.localhost:7324/          a workstation (browsers resolve *.localhost to loopback)
//	https://{token}.preview.example.com/    production (wildcard DNS + TLS terminator in front)
//
// For each request the Server takes the Host header, drops the port, checks
// that everything after the first label equals the template's host suffix,
// and treats the first label as the token. Config.Lookup (the daemon's
// registry) maps the token to a Target, one sandbox port, and the request is
// reverse-proxied there. WebSocket upgrades and streamed responses pass
// through unbuffered.
//
// # How a sandbox port is reached
//
// A sandbox with its own network namespace has its own loopback, which dev
// servers bind to (Vite, Next, Jupyter, python3 -m http.server --bind
// 127.0.0.1), and which no host address reaches. So the Server makes its
// sockets inside the sandbox's namespace (Target.NetNS; a socket belongs to
// the namespace it was created in) and connects from there to 127.0.0.1,
// then ::1, then the sandbox's own address (Target.Addrs). The namespace is
// joined only for socket(2), on a locked OS thread that then returns to the
// host's namespace; the connect goes through the runtime's poller like any
// other, so a listener that never accepts holds no OS thread. Nothing is
// routed between the namespace and the host for this, and the host's own
// loopback is never a Target's. Idle upstream connections are pooled per
// namespace and port, never across sandboxes.
//
// # Security model
//
// The URL is a capability: whoever holds it can use the sandbox port, and
// nothing else is asked of them. So:
//
//   - A token carries 160 bits from crypto/rand (see NewToken). It cannot be
//     guessed or enumerated: the Server never lists tokens, its error pages
//     name no token, and it logs at most a four-character prefix.
//   - A token reaches exactly one sandbox port, the Target that Lookup returns.
//     Nothing in the request (path, headers, query) can change where the
//     Server dials.
//   - No credential is required or consumed. runnerd's bearer token never
//     arrives here (the API lives on another origin), so nothing is stripped:
//     Authorization and Cookie headers belong to the user's app and are
//     forwarded unchanged, as is the Host header, so the app sees the origin
//     the browser sees and its own same-origin checks (WebSocket Origin,
//     CSRF) work. Dev servers that guard against DNS rebinding (Vite,
//     webpack-dev-server) accept *.localhost by default; behind a production
//     domain the app must list that domain among its allowed hosts.
//   - One preview cannot plant cookies on another: a Domain attribute is
//     removed from every Set-Cookie, making each cookie host-only.
//   - The token must not leak to third-party sites through Referer: when the
//     app sets no Referrer-Policy, the Server adds "same-origin".
//   - An unknown token is a 404 that says the preview does not exist. A
//     registry failure is a 503, never a 404: a blip must not read as absence.
//     A Target where nothing listens (every address refuses) is answered at
//     once with a 502 that says the sandbox's port is not serving.
//
// # What an operator configures
//
// On a workstation, the template "http://{token}.localhost:PORT/" with the
// Server listening on 127.0.0.1:PORT is enough: Chromium and Firefox resolve
// every *.localhost name to loopback themselves, so no DNS or /etc/hosts
// entry is needed.
//
// In production, point a wildcard DNS record (*.preview.example.com) at a TLS
// terminator that holds a wildcard certificate and forwards plain HTTP, with
// the Host header unchanged, to the Server. Use a registrable domain that
// serves nothing else (ideally one listed on the Public Suffix List), so a
// preview shares no cookies or origin with the operator's other sites. The
// Server itself speaks plain HTTP/1.1 and never terminates TLS.
//
// # Invariants
//
//   - Close stops and waits for the Server's work: it returns only after
//     every Serve call and every request handler has returned, WebSocket
//     relays included (net/http's own Close does not track those hijacked
//     connections; the Server cancels their context). By then every
//     connection is closed, so the goroutines net/http keeps per connection
//     are exiting too.
//   - Lookup runs for every request, so a token revoked in the registry stops
//     working on the next request, also on a kept-alive connection. A
//     WebSocket opened before the revocation lives until either end closes
//     it.
//   - Close is idempotent; after it, Serve returns http.ErrServerClosed.
//   - Header reads are bounded in time (ReadHeaderTimeout) and size
//     (MaxHeaderBytes). Bodies and upgraded connections are not time-bounded,
//     because a preview may stream or hold a WebSocket for hours.
package preview
