package move_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/agentrunner/runner/client/fleet"
	"github.com/agentrunner/runner/client/fleet/k8s"
	"github.com/agentrunner/runner/client/fleet/k8s/apiservertest"
	"github.com/agentrunner/runner/client/fleet/move"
	"github.com/agentrunner/runner/internal/s3test"
)

const systemNS = "runner-system"

// cluster applies deploy/k8s's namespace, RBAC and DaemonSet to a real
// kube-apiserver, registers nodes Ready and makes the DaemonSet's pod on
// each (Running, Ready, the node's host IP), as the DaemonSet controller
// and a kubelet would (neither runs here).
type cluster struct {
	t     *testing.T
	srv   *apiservertest.Server
	admin *kubernetes.Clientset
	ds    *appsv1.DaemonSet
}

func newCluster(t *testing.T, ctx context.Context) *cluster {
	t.Helper()
	srv := apiservertest.Start(t)
	c := &cluster{t: t, srv: srv, admin: srv.Admin()}
	for _, f := range []string{"namespace.yaml", "rbac.yaml", "daemonset.yaml"} {
		b, err := os.ReadFile("../../../deploy/k8s/" + f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := apiservertest.Decode(b)
		if err != nil {
			t.Fatalf("decode deploy/k8s/%s: %v", f, err)
		}
		if err := apiservertest.Create(ctx, c.admin, systemNS, objs...); err != nil {
			t.Fatalf("apply deploy/k8s/%s: %v", f, err)
		}
	}
	if _, err := c.admin.CoreV1().ServiceAccounts(systemNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ds, err := c.admin.AppsV1().DaemonSets(systemNS).Get(ctx, "runnerd", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.ds = ds
	return c
}

func (c *cluster) addNode(ctx context.Context, name, ip string) {
	c.t.Helper()
	n, err := c.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := c.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	tmpl := c.ds.Spec.Template.DeepCopy()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "runnerd-" + name, Namespace: systemNS, Labels: tmpl.Labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(c.ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}},
		Spec: tmpl.Spec,
	}
	p.Spec.NodeName = name
	if p, err = c.admin.CoreV1().Pods(systemNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	now := metav1.Now()
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, HostIP: ip, HostIPs: []corev1.HostIP{{IP: ip}}, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, StartTime: &now,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}},
	}
	if _, err := c.admin.CoreV1().Pods(systemNS).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// drainNode does what an operator does to move a node's parked
// sandboxes: kubectl cordon, and kubectl annotate runner.dev/drain=move.
func (c *cluster) drainNode(ctx context.Context, name string) {
	c.t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":true},"metadata":{"annotations":{%q:%q}}}`, k8s.DrainAnnotation, k8s.DrainMove)
	if _, err := c.admin.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// TestDrainRealAPIServer is the scenario: three real runnerds
// found through a real kube-apiserver (deploy/k8s's RBAC, a real
// service-account token), a real S3 server. A sandbox with a file and a
// finished session on node-a is parked; node-a is cordoned and annotated;
// the mover drains it: the sandbox resumes on another node with the file
// byte-exact and its session's journal readable from byte 0 with the same
// exit code, and node-a holds nothing of it. Only cordoned and annotated
// nodes drain: node-b, annotated but not cordoned, is left.
func TestDrainRealAPIServer(t *testing.T) {
	needCheckpoints(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := newCluster(t, ctx)
	srv := s3test.Start(t)
	st, _ := openStore(t, srv)

	_, portS, _ := net.SplitHostPort(freeAddr(t))
	port, _ := strconv.Atoi(portS)
	nodes := []string{"node-a", "node-b", "node-c"}
	rds := map[string]*runnerd{}
	for i, n := range nodes {
		ip := fmt.Sprintf("127.0.0.%d", i+1)
		rds[n] = startRunnerd(t, net.JoinHostPort(ip, portS))
		c.addNode(ctx, n, ip)
	}
	tr, err := c.admin.CoreV1().ServiceAccounts(systemNS).CreateToken(ctx, "runner-control-plane", &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(c.srv.Config(tr.Status.Token))
	if err != nil {
		t.Fatal(err)
	}
	disc, err := k8s.New(ctx, cs, k8s.Options{Namespace: systemNS, Selector: metav1.FormatLabelSelector(c.ds.Spec.Selector), Port: port, Token: token, PlainHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer disc.Close()
	pool, err := fleet.New(ctx, disc, fleet.Options{Refresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	na := k8s.NodeRunnerName("node-a")
	ca, err := pool.Client(na)
	if err != nil {
		t.Fatal(err)
	}
	box := makeParked(t, ctx, ca, pool.NewName(na, "agent"))
	before, _ := os.ReadDir(rds["node-a"].state + "/s")
	ownDirs := len(before) - len(box.sessions)

	// node-b: annotated, not cordoned: not drained.
	if _, err := c.admin.CoreV1().Nodes().Patch(ctx, "node-b", types.StrategicMergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, k8s.DrainAnnotation, k8s.DrainMove)), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.drainNode(ctx, "node-a")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, err := disc.Draining(ctx)
		if err == nil && slices.Equal(got, []string{na}) && !slices.Contains(pool.Runners(), na) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Draining = %v, %v; pool runners %v: want [%s], and it out of placement", got, err, pool.Runners(), na)
		}
	}

	mv := move.New(pool, st, move.Options{Holder: "control-plane"})
	start := time.Now()
	reps, err := mv.DrainMarked(ctx, disc)
	if err != nil {
		t.Fatalf("DrainMarked: %v", err)
	}
	t.Logf("drained in %s: %+v", time.Since(start), reps)
	if len(reps) != 1 || reps[0].Runner != na || len(reps[0].Moved) != 1 || len(reps[0].Failed) != 0 {
		t.Fatalf("drain reports %+v: want node-a's one sandbox moved", reps)
	}
	to := reps[0].Moved[box.name]
	if to == "" || to == na {
		t.Fatalf("%s moved to %q, want another node", box.name, to)
	}
	if r, _ := pool.RunnerOf(box.name); r != to {
		t.Fatalf("pool routes %s to %s, want %s", box.name, r, to)
	}
	ct, err := pool.Client(to)
	if err != nil {
		t.Fatal(err)
	}
	checkArrived(t, ctx, ct, box)
	checkGone(t, ctx, ca, rds["node-a"], box, ownDirs)
	// A second pass finds nothing more to do.
	reps, err = mv.DrainMarked(ctx, disc)
	if err != nil || len(reps) != 1 || len(reps[0].Moved)+len(reps[0].Failed)+len(reps[0].Removed) != 0 {
		t.Fatalf("second drain: %+v, %v; want nothing done", reps, err)
	}
}
