package k8s_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/client/fleet"
	"github.com/agentrunner/runner/client/fleet/k8s"
)

var runnerdBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fleet-k8s-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	runnerdBin = filepath.Join(dir, "runnerd")
	cmd := exec.Command("go", "build", "-o", runnerdBin, "github.com/agentrunner/runner/cmd/runnerd")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build runnerd:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const token = "fleet-test-token"

// startRunnerd runs a real runnerd on addr (a loopback address) with the
// fleet's shared token, stopped and removed at cleanup. It holds
// sandboxes only: no session is started, so no shim outlives it.
func startRunnerd(t *testing.T, addr string, flags ...string) {
	t.Helper()
	state := t.TempDir()
	cmd := exec.Command(runnerdBin, append([]string{"--state", state, "--listen", addr, "--socket", "none", "--netpolicy", "off", "--cgroups", "off", "--warm-shims", "0"}, flags...)...)
	cmd.Env = append(os.Environ(), "RUNNERD_TOKEN="+token)
	log, err := os.Create(filepath.Join(state, "runnerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		log.Close()
	})
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if slices.Contains(flags, "--tls-cert") {
			// Serving once its listen file names it (it may require
			// client certificates, so /healthz is no probe).
			if _, err := os.Stat(filepath.Join(state, "listen.json")); err == nil {
				return
			}
			continue
		}
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			return
		}
	}
	b, _ := os.ReadFile(filepath.Join(state, "runnerd.log"))
	t.Fatalf("runnerd on %s did not answer: %s", addr, b)
}

func node(name string, cordoned bool) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Unschedulable: cordoned}}
}

func pod(name, nodeName, hostIP string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "runner-system", Labels: map[string]string{"app.kubernetes.io/name": "runnerd"}},
		Spec:       corev1.PodSpec{NodeName: nodeName, HostNetwork: true},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, HostIP: hostIP, PodIP: hostIP,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}},
		},
	}
}

// TestKubernetesPlacement: three runner pods on three real runnerds
// (127.0.0.1-3, one port), one NotReady and one on a cordoned node:
// placements land only on the healthy one; flipping Ready moves that
// within one refresh; a pod of another label is no runner.
func TestKubernetesPlacement(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, portS, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	port, _ := strconv.Atoi(portS)
	for i := 1; i <= 3; i++ {
		startRunnerd(t, net.JoinHostPort(fmt.Sprintf("127.0.0.%d", i), portS))
	}
	other := pod("web-0", "node-a", "127.0.0.9", true)
	other.Labels = map[string]string{"app": "web"}
	cs := fake.NewClientset(
		node("node-a", false), node("node-b", false), node("node-c.example", true),
		pod("runnerd-a", "node-a", "127.0.0.1", true),
		pod("runnerd-b", "node-b", "127.0.0.2", false),
		pod("runnerd-c", "node-c.example", "127.0.0.3", true),
		other,
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	disc, err := k8s.New(ctx, cs, k8s.Options{Namespace: "runner-system", Selector: "app.kubernetes.io/name=runnerd", Port: port, Token: token, PlainHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer disc.Close()
	na, nb := k8s.NodeRunnerName("node-a"), k8s.NodeRunnerName("node-b")
	eps, err := disc.Runners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nc := k8s.NodeRunnerName("node-c.example")
	wantEps := []fleet.Runner{
		{Endpoint: client.Endpoint{Name: na, URL: "http://127.0.0.1:" + portS, Token: token}},
		{Endpoint: client.Endpoint{Name: nc, URL: "http://127.0.0.3:" + portS, Token: token}, Cordoned: true},
	}
	slices.SortFunc(wantEps, func(a, b fleet.Runner) int { return strings.Compare(a.Name, b.Name) })
	if !slices.Equal(eps, wantEps) {
		t.Fatalf("Runners = %v, want %v (b NotReady, c cordoned, web not a runner)", eps, wantEps)
	}
	p, err := fleet.New(ctx, disc, fleet.Options{Refresh: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	place := func(n int) map[string]int {
		t.Helper()
		count := map[string]int{}
		for range n {
			h, err := p.Place(ctx, "k", adapter.CreateOptions{})
			if err != nil {
				t.Fatalf("Place: %v", err)
			}
			r, _, _ := strings.Cut(h.Name, "-")
			count[r]++
		}
		return count
	}
	if got := place(12); got[na] != 12 {
		t.Errorf("placements = %v, want all 12 on %s (node-a)", got, na)
	}
	first, err := p.Place(ctx, "k", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Flip: b becomes Ready, a NotReady.
	setReady := func(name string, ready bool) {
		t.Helper()
		po, err := cs.CoreV1().Pods("runner-system").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		po.Status.Conditions[0].Status = map[bool]corev1.ConditionStatus{true: corev1.ConditionTrue, false: corev1.ConditionFalse}[ready]
		if _, err := cs.CoreV1().Pods("runner-system").UpdateStatus(ctx, po, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setReady("runnerd-b", true)
	setReady("runnerd-a", false)
	// The watch delivers the change; one refresh of the pool takes it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		eps, _ := disc.Runners(ctx)
		if len(eps) == 2 && slices.ContainsFunc(eps, func(r fleet.Runner) bool { return r.Name == nb }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("discovery did not see the flip in 10s: %v", eps)
		}
	}
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.Runners(); !slices.Equal(got, []string{nb}) {
		t.Errorf("pool runners after one refresh = %v, want [%s]", got, nb)
	}
	if got := place(12); got[nb] != 12 {
		t.Errorf("placements after the flip = %v, want all 12 on %s (node-b)", got, nb)
	}
	// node-a's sandboxes keep their route and are unavailable, never
	// not_found, while its pod is not Ready.
	if _, err := p.Get(ctx, first.Name); !adapter.Transient(err) || err == nil {
		t.Errorf("Get of %s on a NotReady runner = %v, want unavailable", first.Name, err)
	}
	// Uncordoning node-c brings it in at once; re-readying a, too.
	n, err := cs.CoreV1().Nodes().Get(ctx, "node-c.example", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Unschedulable = false
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	setReady("runnerd-a", true)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if eps, _ := disc.Runners(ctx); len(eps) == 3 && !slices.ContainsFunc(eps, func(r fleet.Runner) bool { return r.Cordoned }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("discovery did not see the uncordon in 10s")
		}
	}
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx, first.Name); err != nil {
		t.Errorf("Get of %s once node-a is Ready again: %v", first.Name, err)
	}
	// node-c is empty, a and b hold 13 and 12: two choices favour c
	// whenever it is one of the two (2/3 of picks), so of 30 placements
	// it takes about 20, and more than either other.
	if got := place(30); got[nc] < 13 || got[nc] <= got[na] || got[nc] <= got[nb] {
		t.Errorf("placements after uncordon = %v, want most on the empty %s", got, nc)
	}
}
