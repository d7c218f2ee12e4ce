package runner

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/agentrunner/runner"

// rules say, for each package of this module, which imports are forbidden
// among its transitive dependencies. stdlibOnly packages may depend on
// nothing outside the standard library but the listed module packages.
var rules = []struct {
	pkg        string
	stdlibOnly bool
	allowed    []string // module packages a stdlibOnly package may use, or external modules by full path
	forbidden  []string // path prefixes that must not appear in Deps
	notPkgs    []string // packages (exactly these, not their subpackages) that must not appear in Deps
}{
	{pkg: "adapter", stdlibOnly: true},
	{pkg: "adapter/fake", stdlibOnly: true, allowed: []string{"adapter"}},
	{pkg: "adapter/conformance", stdlibOnly: true, allowed: []string{"adapter"}},
	// adapter/stream is the client-side protocol every provider shares; a
	// provider package added under adapter/ gets its own row here
	// (TestAdapterSubpackagesHaveRules insists).
	{pkg: "adapter/stream", stdlibOnly: true, allowed: []string{"adapter", "wire"}},
	{pkg: "adapter/guest", stdlibOnly: true, allowed: []string{"adapter", "adapter/guest/guestproto", "adapter/stream", "wire"}},
	// adapter/guest/guestproto is runner-shim's --json answer, written by
	// cmd/runner-shim and read by the adapters.
	{pkg: "adapter/guest/guestproto", stdlibOnly: true, allowed: []string{"wire"}},
	// adapter/hosted is the portable hosted adapter the providers' drivers
	// plug into.
	{pkg: "adapter/hosted", stdlibOnly: true, allowed: []string{"adapter", "adapter/guest", "adapter/guest/guestproto", "adapter/stream", "wire"}},
	// adapter/hosted/httpcall is the one error type, error-table
	// classifier and HTTP caller the hosted providers share.
	{pkg: "adapter/hosted/httpcall", stdlibOnly: true, allowed: []string{"adapter", "adapter/secret"}},
	// adapter/hosted/hostedtest is the provider scenarios every driver's
	// tests run (stdlib + testing).
	{pkg: "adapter/hosted/hostedtest", stdlibOnly: true, allowed: []string{"adapter", "adapter/conformance"}},
	// adapter/internal/standin is the PTY and process-tag plumbing the
	// provider stand-ins share.
	{pkg: "adapter/internal/standin", stdlibOnly: true},
	// adapter/secret is the credential type the hosted providers share.
	{pkg: "adapter/secret", stdlibOnly: true},
	{pkg: "adapter/e2b", stdlibOnly: true, allowed: []string{"adapter", "adapter/secret", "adapter/guest", "adapter/guest/guestproto", "adapter/hosted", "adapter/hosted/httpcall", "adapter/stream", "wire"}},
	{pkg: "adapter/e2b/e2btest", stdlibOnly: true, allowed: []string{"adapter", "adapter/secret", "adapter/internal/standin", "adapter/e2b", "adapter/guest", "adapter/guest/guestproto", "adapter/hosted", "adapter/hosted/httpcall", "adapter/stream", "wire"}},
	{pkg: "adapter/daytona", stdlibOnly: true, allowed: []string{"adapter", "adapter/secret", "adapter/guest", "adapter/guest/guestproto", "adapter/hosted", "adapter/hosted/httpcall", "adapter/stream", "wire"}},
	{pkg: "adapter/daytona/daytonatest", stdlibOnly: true, allowed: []string{"adapter", "adapter/secret", "adapter/internal/standin", "adapter/daytona", "adapter/guest", "adapter/guest/guestproto", "adapter/hosted", "adapter/hosted/httpcall", "adapter/stream", "wire"}},
	// The Sprites exec API is a WebSocket: coder/websocket (stdlib-only
	// itself) is the one module outside this one these two may use.
	{pkg: "adapter/sprites", stdlibOnly: true, allowed: []string{"adapter", "adapter/secret", "adapter/guest", "adapter/guest/guestproto", "adapter/hosted", "adapter/hosted/httpcall", "adapter/stream", "wire", "github.com/coder/websocket"}},
	{pkg: "adapter/sprites/spritestest", stdlibOnly: true, allowed: []string{"adapter", "adapter/secret", "adapter/internal/standin", "adapter/sprites", "adapter/guest", "adapter/guest/guestproto", "adapter/hosted", "adapter/hosted/httpcall", "adapter/stream", "wire", "github.com/coder/websocket"}},
	{pkg: "wire", stdlibOnly: true},
	{pkg: "internal/atomicfile", stdlibOnly: true},
	{pkg: "internal/keyed", stdlibOnly: true},
	// internal/runnerdtest starts real runnerd processes for tests; it
	// runs the binary, never imports the daemon.
	{pkg: "internal/runnerdtest", stdlibOnly: true, allowed: []string{"go.uber.org/goleak", "internal/gobuild"}},
	// internal/gobuild builds this module's programs for tests.
	{pkg: "internal/gobuild", stdlibOnly: true},
	// internal/browsertest runs headless Chromium for the preview tests.
	{pkg: "internal/browsertest", stdlibOnly: true},
	// internal/testpki makes throwaway CAs for TLS tests.
	{pkg: "internal/testpki", stdlibOnly: true},
	// internal/logsink is the concurrent log buffer tests read.
	{pkg: "internal/logsink", stdlibOnly: true},
	// internal/ostest is the file and pipe waits tests share.
	{pkg: "internal/ostest", stdlibOnly: true, allowed: []string{"golang.org/x/sys"}},
	// internal/loopns is the loopback-only network namespace tests' real
	// servers listen in (kube-apiserver, etcd, S3).
	{pkg: "internal/loopns", stdlibOnly: true, allowed: []string{"golang.org/x/sys"}},
	{pkg: "client", forbidden: []string{
		module + "/daemon", module + "/journal", module + "/shim", module + "/netpolicy",
		"go.etcd.io/bbolt", "github.com/google/nftables", "github.com/vishvananda/",
		"k8s.io/", "sigs.k8s.io/",
	}},
	// runner, the CLI, is a client of runnerd and nothing more: it holds
	// client's line, and cmd/runner is one call of it.
	{pkg: "cli", forbidden: []string{
		module + "/daemon", module + "/journal", module + "/shim", module + "/netpolicy",
		"go.etcd.io/bbolt", "github.com/google/nftables", "github.com/vishvananda/",
		"k8s.io/", "sigs.k8s.io/",
	}},
	{pkg: "cmd/runner", forbidden: []string{
		module + "/daemon", module + "/journal", module + "/shim", module + "/netpolicy",
		"go.etcd.io/bbolt", "github.com/google/nftables", "github.com/vishvananda/",
		"k8s.io/", "sigs.k8s.io/",
	}},
	// Placement over a fleet pulls no Kubernetes module: only
	// client/fleet/k8s does, for control planes that use it.
	{pkg: "client/fleet", forbidden: []string{
		module + "/daemon", module + "/journal", module + "/shim", module + "/netpolicy", module + "/client/fleet/k8s",
		"go.etcd.io/bbolt", "github.com/google/nftables", "github.com/vishvananda/",
		"k8s.io/", "sigs.k8s.io/", "github.com/minio/",
	}},
	// Moving sandboxes through a bucket is its own package: the S3 client
	// stays out of client/fleet and out of the Kubernetes discovery.
	{pkg: "client/fleet/move", forbidden: []string{
		module + "/daemon", module + "/journal", module + "/shim", module + "/netpolicy", module + "/client/fleet/k8s",
		"go.etcd.io/bbolt", "github.com/google/nftables", "github.com/vishvananda/", "k8s.io/", "sigs.k8s.io/",
	}},
	{pkg: "client/fleet/k8s", forbidden: []string{"github.com/minio/",
		module + "/daemon", module + "/journal", module + "/shim", module + "/netpolicy",
		"go.etcd.io/bbolt", "github.com/google/nftables", "github.com/vishvananda/",
	}},
	{pkg: "journal", forbidden: []string{
		module + "/daemon", module + "/client", module + "/shim", module + "/netpolicy", module + "/adapter",
	}},
	// The shim is cut by role (docs/architecture.md): the supervisor
	// process (shim), the launcher runnerd starts and drives shims with
	// (shim/launch), and the readers of a session directory
	// (shim/sessiondir). daemon -> launch -> sessiondir; shim ->
	// sessiondir; only the binaries import shim (TestSupervisorOnlyInBinaries).
	{pkg: "shim", forbidden: []string{
		module + "/daemon", module + "/client", module + "/netpolicy", module + "/adapter",
		"github.com/google/nftables", "github.com/vishvananda/",
	}, notPkgs: []string{module + "/shim/launch"}},
	// shim/launch imports seccomp for one thing: it compiles the
	// sandbox's filter once per runnerd and hands every shim the bytes
	// (launch/filter.go), so no shim compiles it on a start's path.
	{pkg: "shim/launch", forbidden: []string{
		module + "/daemon", module + "/client", module + "/netpolicy", module + "/adapter", module + "/cgroup",
		"github.com/google/nftables", "github.com/vishvananda/",
	}, notPkgs: []string{module + "/shim"}},
	{pkg: "shim/sessiondir", forbidden: []string{
		module + "/daemon", module + "/client", module + "/netpolicy", module + "/adapter", module + "/cgroup", module + "/seccomp",
		"github.com/google/nftables", "github.com/vishvananda/",
	}, notPkgs: []string{module + "/shim", module + "/shim/launch"}},
	{pkg: "netpolicy", forbidden: []string{
		module + "/daemon", module + "/client", module + "/journal", module + "/shim", module + "/adapter",
	}},
	{pkg: "cgroup/oom", stdlibOnly: true},
	// seccomp is the isolated command's filter: the moby profile and a
	// pure-Go compiler, nothing of the runner (the in-guest shim imports it).
	{pkg: "seccomp", forbidden: []string{
		module + "/daemon", module + "/client", module + "/shim", module + "/netpolicy", module + "/adapter", module + "/journal", module + "/cgroup",
	}},
	{pkg: "cgroup", forbidden: []string{
		module + "/daemon", module + "/client", module + "/shim", module + "/netpolicy", module + "/adapter", module + "/journal",
	}},
	// checkpoint stores a sandbox's disk: chunker, zstd, nothing of the runner.
	{pkg: "checkpoint", forbidden: []string{
		module + "/daemon", module + "/client", module + "/shim", module + "/netpolicy", module + "/adapter", module + "/journal", module + "/cgroup",
	}},
	// daemon/apierr is the error vocabulary the managers and the HTTP
	// face share: a leaf every package under daemon may import.
	{pkg: "daemon/apierr", stdlibOnly: true, allowed: []string{"wire"}},
	// daemon/sandboxes is the sandboxes manager: below the HTTP face
	// (daemon) and the session side, above the registry. It never reaches
	// up to daemon, nor to what starts and drives shims (shim/launch):
	// it asks the session side through sandboxes.Sessions.
	{pkg: "daemon/sandboxes", forbidden: []string{
		module + "/client", module + "/adapter", module + "/shim/launch", module + "/daemon/preview", module + "/daemon/sessions",
	}, notPkgs: []string{module + "/daemon", module + "/shim"}},
	// daemon/sessions is the sessions manager: below the HTTP face, above
	// the sandboxes manager (which it asks for a spawn's identity, leaf
	// cgroup, namespace and binds) and the registry; it never reaches up.
	{pkg: "daemon/sessions", forbidden: []string{
		module + "/client", module + "/adapter", module + "/daemon/preview",
	}, notPkgs: []string{module + "/daemon", module + "/shim"}},
	{pkg: "daemon", forbidden: []string{module + "/client", module + "/adapter"}, notPkgs: []string{module + "/shim"}},
}

// TestDependencyDirection fails when a package imports across the lines in
// docs/architecture.md: the contract stays stdlib-only, the client never
// pulls in the daemon's storage or kernel libraries, and so on.
func TestDependencyDirection(t *testing.T) {
	deps := listDeps(t)
	for _, r := range rules {
		path := module + "/" + r.pkg
		pkgDeps, ok := deps[path]
		if !ok {
			t.Errorf("package %s does not exist; the layout in docs/architecture.md names it", r.pkg)
			continue
		}
		for _, d := range pkgDeps {
			if r.stdlibOnly && !isStdlib(d) && !isAllowed(d, r.allowed) {
				t.Errorf("%s must import only the standard library, but depends on %s", r.pkg, d)
			}
			for _, f := range r.forbidden {
				if strings.HasPrefix(d, f) {
					t.Errorf("%s must not depend on %s (via %s)", r.pkg, f, d)
				}
			}
			if slices.Contains(r.notPkgs, d) {
				t.Errorf("%s must not depend on %s", r.pkg, d)
			}
		}
	}
}

// TestAdapterSubpackagesHaveRules: every package under adapter/ is held to
// an explicit stdlib-plus-listed-packages row, so a provider package (or a
// helper beside it) cannot quietly pull the daemon's storage or kernel
// libraries into control planes that import it.
func TestAdapterSubpackagesHaveRules(t *testing.T) {
	ruled := map[string]bool{}
	for _, r := range rules {
		if r.stdlibOnly {
			ruled[module+"/"+r.pkg] = true
		}
	}
	for path := range listDeps(t) {
		if strings.HasPrefix(path, module+"/adapter/") && !ruled[path] {
			t.Errorf("package %s has no stdlibOnly row in rules: list the module packages it may import", path)
		}
	}
}

// TestNoGrabBagPackages keeps to the house rule: no util, common or helpers.
func TestNoGrabBagPackages(t *testing.T) {
	for path := range listDeps(t) {
		last := path[strings.LastIndex(path, "/")+1:]
		switch last {
		case "util", "utils", "common", "helpers", "misc":
			t.Errorf("package %s: name a package for its one job, not %q", path, last)
		}
	}
}

func listDeps(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{"\t"}}{{join .Deps " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, rest, _ := strings.Cut(line, "\t")
		deps[path] = strings.Fields(rest)
	}
	return deps
}

// isStdlib reports whether an import path belongs to the standard library:
// its first element has no dot (the module's own paths all start with
// github.com). The vendored golang.org/x copies inside std are spelled
// vendor/golang.org/x/..., which this also accepts.
func isStdlib(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

func isAllowed(path string, allowed []string) bool {
	for _, a := range allowed {
		if path == module+"/"+a {
			return true
		}
		// An external module (its first element has a dot) is allowed
		// with its subpackages (coder/websocket/internal/...).
		if first, _, _ := strings.Cut(a, "/"); strings.Contains(first, ".") && (path == a || strings.HasPrefix(path, a+"/")) {
			return true
		}
	}
	return false
}
