package client_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// TestDiscoverForLooksOnlyForWhatIsMissing: a caller that has the
// endpoint needs no listen file, and one that has the token needs no
// token file; Discover itself fails on each of those state directories.
func TestDiscoverForLooksOnlyForWhatIsMissing(t *testing.T) {
	for _, k := range []string{client.EnvURL, client.EnvToken, client.EnvListen, "STATE_DIRECTORY", "XDG_STATE_HOME"} {
		t.Setenv(k, "")
	}
	t.Setenv("HOME", t.TempDir())

	tokenOnly := t.TempDir()
	if err := os.WriteFile(filepath.Join(tokenOnly, "token"), []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	listenOnly := t.TempDir()
	if err := os.WriteFile(filepath.Join(listenOnly, wire.ListenFile), []byte(`{"tcp":"127.0.0.1:1"}`), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name            string
		state           string
		endpoint, token string
		wantEndpoint    string
		wantToken       string
	}{
		{name: "endpoint given, token from STATE/token", state: tokenOnly,
			endpoint: "http://127.0.0.1:2", wantEndpoint: "http://127.0.0.1:2", wantToken: "tok"},
		{name: "token given, endpoint from listen.json", state: listenOnly,
			token: "given", wantEndpoint: "http://127.0.0.1:1", wantToken: "given"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(client.EnvState, tt.state)
			if l, err := client.Discover(); err == nil {
				t.Fatalf("Discover: got %v, want an error (the state directory lacks something)", l)
			}
			l, err := client.DiscoverFor(tt.endpoint, tt.token)
			if err != nil {
				t.Fatalf("DiscoverFor(%q, token): %v", tt.endpoint, err)
			}
			if l.Endpoint != tt.wantEndpoint || l.Token() != tt.wantToken {
				t.Fatalf("DiscoverFor: got endpoint %s token %q, want %s and %q", l.Endpoint, l.Token(), tt.wantEndpoint, tt.wantToken)
			}
		})
	}
}
