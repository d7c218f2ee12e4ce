package k8s_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/client/fleet"
	"github.com/agentrunner/runner/client/fleet/k8s"
	"github.com/agentrunner/runner/internal/testpki"
)

// pushBound is how soon after a node event the pool must stop placing on
// the node (the bound); the periodic refresh is an hour, so only
// a push can meet it.
const pushBound = time.Second

// TestKubernetesPushOverTLS: three runnerds serving TLS with client
// certificates required, discovered through https routes; cordoning a
// node, then marking another NotReady, stops placements there within
// pushBound of the API update, with the pool's periodic refresh an hour
// away; placements land over mTLS and the sandboxes of the cordoned node
// stay reachable.
func TestKubernetesPushOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	// One certificate for the fleet, by name, as deploy/k8s makes it; the
	// pool dials node addresses and verifies that name.
	srv := ca.Server(t, "runnerd", "runnerd.runner-system")
	cl := ca.Client(t, "control-plane")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, portS, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	var port int
	fmt.Sscan(portS, &port)
	for i := 1; i <= 3; i++ {
		startRunnerd(t, net.JoinHostPort(fmt.Sprintf("127.0.0.%d", i), portS),
			"--tls-cert", srv.CertFile, "--tls-key", srv.KeyFile, "--tls-client-ca", ca.CertFile)
	}
	cs := fake.NewClientset(
		node("node-a", false), node("node-b", false), node("node-c", false),
		pod("runnerd-a", "node-a", "127.0.0.1", true),
		pod("runnerd-b", "node-b", "127.0.0.2", true),
		pod("runnerd-c", "node-c", "127.0.0.3", true),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	disc, err := k8s.New(ctx, cs, k8s.Options{Namespace: "runner-system", Selector: "app.kubernetes.io/name=runnerd", Port: port, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer disc.Close()
	eps, err := disc.Runners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range eps {
		if !strings.HasPrefix(ep.URL, "https://") {
			t.Fatalf("route %s: want https", ep)
		}
	}
	p, err := fleet.New(ctx, disc, fleet.Options{Refresh: time.Hour,
		Adapter: client.AdapterOptions{Client: client.Options{RootCAs: ca.Pool(), Certificate: &cl.TLS, ServerName: "runnerd.runner-system"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	na, nb, nc := k8s.NodeRunnerName("node-a"), k8s.NodeRunnerName("node-b"), k8s.NodeRunnerName("node-c")
	place := func(n int) (map[string]int, adapter.Handle) {
		t.Helper()
		count := map[string]int{}
		var last adapter.Handle
		for range n {
			h, err := p.Place(ctx, "k", adapter.CreateOptions{})
			if err != nil {
				t.Fatalf("Place over mTLS: %v", err)
			}
			r, _, _ := strings.Cut(h.Name, "-")
			count[r]++
			last = h
		}
		return count, last
	}
	if got, _ := place(9); got[na] == 0 || got[nb] == 0 || got[nc] == 0 {
		t.Fatalf("placements before any change = %v, want some on each of the three", got)
	}
	onA := func() adapter.Handle {
		for {
			got, h := place(1)
			if got[na] == 1 {
				return h
			}
		}
	}()

	// Cordon node-a.
	n, err := cs.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Unschedulable = true
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pushBound)
	if got, _ := place(12); got[na] != 0 {
		t.Fatalf("placements %v after cordoning node-a %v ago: want none on %s", got, pushBound, na)
	}
	if _, err := p.Get(ctx, onA.Name); err != nil {
		t.Fatalf("Get of %s on the cordoned node: %v", onA.Name, err)
	}

	// node-b goes NotReady (its kubelet stops reporting); its pod still
	// says Ready.
	n, err = cs.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pushBound)
	if got, _ := place(12); got[nc] != 12 {
		t.Fatalf("placements %v after node-b went NotReady %v ago: want all 12 on %s", got, pushBound, nc)
	}
}
