package preview

import (
	"strings"
	"testing"
)

func TestParseTemplate(t *testing.T) {
	tok := strings.Repeat("b", TokenLen)
	tests := []struct {
		name       string
		in         string
		wantErr    string // substring; "" means valid
		wantURL    string // URL for tok
		wantSuffix string
	}{
		{name: "workstation", in: "http://{token}.localhost:7324/",
			wantURL: "http://" + tok + ".localhost:7324/", wantSuffix: ".localhost"},
		{name: "production", in: "https://{token}.preview.example.com/",
			wantURL: "https://" + tok + ".preview.example.com/", wantSuffix: ".preview.example.com"},
		{name: "no trailing slash", in: "https://{token}.preview.example.com",
			wantURL: "https://" + tok + ".preview.example.com/", wantSuffix: ".preview.example.com"},
		{name: "port without slash", in: "http://{token}.localhost:7324",
			wantURL: "http://" + tok + ".localhost:7324/", wantSuffix: ".localhost"},
		{name: "mixed-case domain", in: "https://{token}.Preview.Example.com/",
			wantURL: "https://" + tok + ".Preview.Example.com/", wantSuffix: ".preview.example.com"},

		{name: "empty", in: "", wantErr: "exactly once"},
		{name: "no placeholder", in: "http://preview.localhost:7324/", wantErr: "exactly once"},
		{name: "placeholder twice", in: "http://{token}.localhost/{token}", wantErr: "exactly once"},
		{name: "upper-case placeholder", in: "http://{TOKEN}.localhost/", wantErr: "exactly once"},
		{name: "in the path", in: "http://localhost:7324/{token}/", wantErr: "no path"},
		{name: "in the query", in: "http://localhost:7324/?t={token}", wantErr: "no path"},
		{name: "not the first label", in: "http://x.{token}.localhost/", wantErr: "first label"},
		{name: "part of a label", in: "http://p-{token}.localhost/", wantErr: "first label"},
		{name: "label with suffix", in: "http://{token}-p.localhost/", wantErr: "first label"},
		{name: "bare token host", in: "http://{token}/", wantErr: "needs a domain"},
		{name: "bare token host with port", in: "http://{token}:7324/", wantErr: "needs a domain"},
		{name: "empty domain", in: "http://{token}./", wantErr: "needs a domain"},
		{name: "empty inner label", in: "http://{token}.preview..example.com/", wantErr: "invalid DNS label"},
		{name: "underscore label", in: "http://{token}.pre_view.example.com/", wantErr: "invalid DNS label"},
		{name: "hyphen-led label", in: "http://{token}.-x.example.com/", wantErr: "invalid DNS label"},
		{name: "no scheme", in: "{token}.localhost:7324", wantErr: "scheme"},
		{name: "ftp", in: "ftp://{token}.localhost/", wantErr: "scheme"},
		{name: "ws", in: "ws://{token}.localhost/", wantErr: "scheme"},
		{name: "user info", in: "http://u:p@{token}.localhost/", wantErr: "user info"},
		{name: "path", in: "http://{token}.localhost/app/", wantErr: "no path"},
		{name: "query", in: "http://{token}.localhost/?a=b", wantErr: "no path"},
		{name: "empty query", in: "http://{token}.localhost/?", wantErr: "no path"},
		{name: "fragment", in: "http://{token}.localhost/#x", wantErr: "no path"},
		{name: "port zero", in: "http://{token}.localhost:0/", wantErr: "port"},
		{name: "port too big", in: "http://{token}.localhost:65536/", wantErr: "port"},
		{name: "empty port", in: "http://{token}.localhost:/", wantErr: "empty port"},
		{name: "space", in: "http://{token}.local host/", wantErr: "URL template"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTemplate(tt.in)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("parseTemplate(%q) accepted it, want an error containing %q", tt.in, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseTemplate(%q) error = %q, want it to contain %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseTemplate(%q): %v", tt.in, err)
			}
			if u := got.prefix + tok + got.suffix; u != tt.wantURL {
				t.Errorf("URL = %q, want %q", u, tt.wantURL)
			}
			if got.hostSuffix != tt.wantSuffix {
				t.Errorf("hostSuffix = %q, want %q", got.hostSuffix, tt.wantSuffix)
			}
			// What URL produces, the router must route back to the token.
			host := strings.TrimSuffix(strings.SplitN(tt.wantURL, "://", 2)[1], "/")
			if back := got.tokenFromHost(host); back != tok {
				t.Errorf("tokenFromHost(%q) = %q, want the token", host, back)
			}
		})
	}
}

func TestTokenFromHost(t *testing.T) {
	tmpl, err := parseTemplate("https://{token}.preview.example.com/")
	if err != nil {
		t.Fatal(err)
	}
	tok := strings.Repeat("c", TokenLen)
	tests := []struct{ host, want string }{
		{tok + ".preview.example.com", tok},
		{tok + ".preview.example.com:443", tok},
		{tok + ".preview.example.com:8080", tok}, // port is the terminator's business
		{tok + ".preview.example.com.", tok},
		{strings.ToUpper(tok) + ".PREVIEW.EXAMPLE.COM", tok},
		{tok + ".example.com", ""},
		{tok + ".preview.example.com.evil.test", ""},
		{tok + "preview.example.com", ""},
		{"x" + tok + ".preview.example.com", ""},
		{"x." + tok + ".preview.example.com", ""},
		{".preview.example.com", ""},
		{"preview.example.com", ""},
		{"[::1]:443", ""},
		{"", ""},
	}
	for _, tt := range tests {
		if got := tmpl.tokenFromHost(tt.host); got != tt.want {
			t.Errorf("tokenFromHost(%q) = %q, want %q", tt.host, got, tt.want)
		}
	}
}
