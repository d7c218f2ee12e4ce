package k8s_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/client/fleet"
	"github.com/agentrunner/runner/client/fleet/k8s"
	"github.com/agentrunner/runner/client/fleet/k8s/apiservertest"
)

const systemNS = "runner-system"

// realCluster is deploy/k8s applied to a real kube-apiserver: the
// namespace, the RBAC and the DaemonSet as the repository has them, nodes
// registered and the DaemonSet's pods made by the test (as the DaemonSet
// controller and a kubelet would: bound to a node, then Running, Ready,
// with a host IP).
type realCluster struct {
	t        *testing.T
	srv      *apiservertest.Server
	admin    *kubernetes.Clientset
	ds       *appsv1.DaemonSet
	selector string
	hostIP   map[string]string // node → its host address (a real runnerd's)
}

func newRealCluster(t *testing.T, ctx context.Context) *realCluster {
	t.Helper()
	srv := apiservertest.Start(t)
	c := &realCluster{t: t, srv: srv, admin: srv.Admin(), hostIP: map[string]string{}}
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
			t.Fatalf("apply deploy/k8s/%s to a real API server: %v", f, err)
		}
	}
	// The namespace's default service account, which the controller
	// manager (not run here) would make; pods that name none use it.
	if _, err := c.admin.CoreV1().ServiceAccounts(systemNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ds, err := c.admin.AppsV1().DaemonSets(systemNS).Get(ctx, "runnerd", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.ds = ds
	c.selector = metav1.FormatLabelSelector(ds.Spec.Selector)
	return c
}

// token is a real service-account token (TokenRequest) for sa in
// runner-system: the discovery authenticates as the control plane's
// service account of rbac.yaml, bound by rbac.yaml's own binding.
func (c *realCluster) token(ctx context.Context, sa string) string {
	c.t.Helper()
	tr, err := c.admin.CoreV1().ServiceAccounts(systemNS).CreateToken(ctx, sa,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("request a token for %s: %v", sa, err)
	}
	return tr.Status.Token
}

func (c *realCluster) clientset(token string) *kubernetes.Clientset {
	c.t.Helper()
	cs, err := kubernetes.NewForConfig(c.srv.Config(token))
	if err != nil {
		c.t.Fatal(err)
	}
	return cs
}

// addNode registers a node and reports it Ready, as its kubelet would.
func (c *realCluster) addNode(ctx context.Context, name, hostIP string) {
	c.t.Helper()
	n, err := c.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.hostIP[name] = hostIP
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: hostIP}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := c.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// setNodeReady reports node's Ready condition as status.
func (c *realCluster) setNodeReady(ctx context.Context, name string, status corev1.ConditionStatus) {
	c.t.Helper()
	n, err := c.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := c.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// cordon sets node.spec.unschedulable, as kubectl cordon does.
func (c *realCluster) cordon(ctx context.Context, name string, on bool) {
	c.t.Helper()
	n, err := c.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	n.Spec.Unschedulable = on
	if _, err := c.admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// addPod makes the DaemonSet's pod for node from its template, owned by
// it and bound to the node, and sets its status as the kubelet would once
// the readiness probe passed: Running, Ready, the host IP.
func (c *realCluster) addPod(ctx context.Context, node string) *corev1.Pod {
	c.t.Helper()
	tmpl := c.ds.Spec.Template.DeepCopy()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "runnerd-" + node, Namespace: systemNS, Labels: tmpl.Labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(c.ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))},
		},
		Spec: tmpl.Spec,
	}
	p.Spec.NodeName = node
	p, err := c.admin.CoreV1().Pods(systemNS).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create the DaemonSet's pod on %s: %v", node, err)
	}
	ip := c.hostIP[node]
	now := metav1.Now()
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, HostIP: ip, HostIPs: []corev1.HostIP{{IP: ip}}, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	p, err = c.admin.CoreV1().Pods(systemNS).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if err != nil {
		c.t.Fatalf("set the status of the pod on %s: %v", node, err)
	}
	return p
}

// waitFor polls cond until it holds or limit passes, and says how long it
// took.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	for time.Since(start) < limit {
		var ok bool
		if ok, last = cond(); ok {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s; last: %s", what, limit, last)
	return 0
}

// statusCode is the HTTP status of an API error, or 0.
func statusCode(err error) int32 {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return se.Status().Code
	}
	return 0
}

// TestRealAPIServer runs the discovery against a real kube-apiserver with
// deploy/k8s applied: through the control plane's service-account token
// and rbac.yaml's ClusterRole only, three runner pods on three real
// runnerds are found, a cordon, a NotReady node and a deleted pod reach
// the pool by push, RBAC refuses what the ClusterRole does not grant, and
// the informers recover from watches that end and restart at a resource
// version the server has compacted away (410 Gone).
func TestRealAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := newRealCluster(t, ctx)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, portS, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	port, _ := strconv.Atoi(portS)
	nodes := []string{"node-a", "node-b", "node-c.example"}
	for i, n := range nodes {
		ip := fmt.Sprintf("127.0.0.%d", i+1)
		startRunnerd(t, net.JoinHostPort(ip, portS))
		c.addNode(ctx, n, ip)
		c.addPod(ctx, n)
	}
	// A pod of another workload on node-a is no runner.
	web := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: systemNS, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "web", Image: "example.invalid/web:1"}}}}
	if _, err := c.admin.CoreV1().Pods(systemNS).Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	discToken := c.token(ctx, "runner-control-plane")
	discCfg := c.srv.Config(discToken)
	var reqs requestLog
	discCfg.WrapTransport = reqs.wrap
	discCS, err := kubernetes.NewForConfig(discCfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := k8s.New(ctx, discCS, k8s.Options{Namespace: systemNS, Selector: c.selector, Port: port, Token: token, PlainHTTP: true})
	if err != nil {
		t.Fatalf("discovery through rbac.yaml's ClusterRole: %v", err)
	}
	defer disc.Close()
	na, nb, nc := k8s.NodeRunnerName("node-a"), k8s.NodeRunnerName("node-b"), k8s.NodeRunnerName("node-c.example")
	route := func(name, ip string, cordoned bool) fleet.Runner {
		return fleet.Runner{Endpoint: client.Endpoint{Name: name, URL: "http://" + net.JoinHostPort(ip, portS), Token: token}, Cordoned: cordoned}
	}
	sorted := func(rs ...fleet.Runner) []fleet.Runner {
		slices.SortFunc(rs, func(a, b fleet.Runner) int { return strings.Compare(a.Name, b.Name) })
		return rs
	}
	runnersAre := func(want []fleet.Runner) func() (bool, string) {
		return func() (bool, string) {
			got, err := disc.Runners(ctx)
			if err != nil {
				return false, err.Error()
			}
			return slices.Equal(got, want), fmt.Sprintf("Runners = %v, want %v", got, want)
		}
	}
	all := sorted(route(na, "127.0.0.1", false), route(nb, "127.0.0.2", false), route(nc, "127.0.0.3", false))
	if ok, msg := runnersAre(all)(); !ok {
		t.Fatalf("after sync: %s", msg)
	}

	// The pool refreshes by itself once an hour: only the informers' push
	// can move placements within the waits below.
	p, err := fleet.New(ctx, disc, fleet.Options{Refresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	poolIs := func(want ...string) func() (bool, string) {
		slices.Sort(want)
		return func() (bool, string) {
			got := p.Runners()
			return slices.Equal(got, want), fmt.Sprintf("pool runners = %v, want %v", got, want)
		}
	}
	place := func(n int) (map[string]int, adapter.Handle) {
		t.Helper()
		count := map[string]int{}
		var last adapter.Handle
		for range n {
			h, err := p.Place(ctx, "k", adapter.CreateOptions{})
			if err != nil {
				t.Fatalf("Place: %v", err)
			}
			r, _, _ := strings.Cut(h.Name, "-")
			count[r]++
			last = h
		}
		return count, last
	}
	if got, _ := place(9); got[na] == 0 || got[nb] == 0 || got[nc] == 0 {
		t.Fatalf("placements = %v, want some on each of the three", got)
	}
	var onA adapter.Handle
	for onA.Name == "" {
		if got, h := place(1); got[na] == 1 {
			onA = h
		}
	}

	t.Run("cordon", func(t *testing.T) {
		c.cordon(ctx, "node-a", true)
		took := waitFor(t, "the pool drops cordoned node-a", 10*time.Second, poolIs(nb, nc))
		t.Logf("cordon reached the pool in %s", took)
		if ok, msg := runnersAre(sorted(route(na, "127.0.0.1", true), route(nb, "127.0.0.2", false), route(nc, "127.0.0.3", false)))(); !ok {
			t.Fatal(msg)
		}
		if got, _ := place(6); got[na] != 0 {
			t.Errorf("placements %v after the cordon: want none on %s", got, na)
		}
		if _, err := p.Get(ctx, onA.Name); err != nil {
			t.Errorf("Get of %s on the cordoned node: %v", onA.Name, err)
		}
	})

	t.Run("node NotReady", func(t *testing.T) {
		c.setNodeReady(ctx, "node-b", corev1.ConditionUnknown)
		took := waitFor(t, "the pool drops NotReady node-b", 10*time.Second, poolIs(nc))
		t.Logf("NotReady reached the pool in %s", took)
		if got, _ := place(6); got[nc] != 6 {
			t.Errorf("placements %v with node-b NotReady: want all 6 on %s", got, nc)
		}
	})

	t.Run("deleted pod", func(t *testing.T) {
		// A real server does not remove a bound pod at once: it marks it
		// (deletionTimestamp) and waits for the kubelet. The discovery
		// drops it at the mark.
		if err := c.admin.CoreV1().Pods(systemNS).Delete(ctx, "runnerd-node-c.example", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		po, err := c.admin.CoreV1().Pods(systemNS).Get(ctx, "runnerd-node-c.example", metav1.GetOptions{})
		if err != nil || po.DeletionTimestamp == nil {
			t.Fatalf("a deleted bound pod: got %v, %v; want it Terminating (a real server waits for the kubelet)", po.DeletionTimestamp, err)
		}
		waitFor(t, "the pool drops the Terminating pod's runner", 10*time.Second, poolIs())
		if ok, msg := runnersAre(sorted(route(na, "127.0.0.1", true), route(nb, "127.0.0.2", true)))(); !ok {
			t.Fatal(msg)
		}
		// The kubelet confirms (grace 0): the object goes.
		zero := int64(0)
		if err := c.admin.CoreV1().Pods(systemNS).Delete(ctx, "runnerd-node-c.example", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the pod is gone", 10*time.Second, func() (bool, string) {
			_, err := c.admin.CoreV1().Pods(systemNS).Get(ctx, "runnerd-node-c.example", metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
		if _, err := p.Place(ctx, "k", adapter.CreateOptions{}); !adapter.Transient(err) {
			t.Errorf("Place with no schedulable runner = %v, want unavailable", err)
		}
		// Back: uncordon a, b Ready, a new pod on node-c.
		c.cordon(ctx, "node-a", false)
		c.setNodeReady(ctx, "node-b", corev1.ConditionTrue)
		c.addPod(ctx, "node-c.example")
		waitFor(t, "all three back", 10*time.Second, poolIs(na, nb, nc))
	})

	t.Run("RBAC", func(t *testing.T) {
		cs := c.clientset(discToken)
		if _, err := cs.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: c.selector}); err != nil {
			t.Errorf("list pods with the discovery's token: %v", err)
		}
		if _, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("list nodes with the discovery's token: %v", err)
		}
		for _, res := range []string{"pods", "nodes"} {
			var w watch.Interface
			var err error
			if res == "pods" {
				w, err = cs.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{})
			} else {
				w, err = cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
			}
			if err != nil {
				t.Errorf("watch %s with the discovery's token: %v", res, err)
				continue
			}
			w.Stop()
		}
		zero := int64(0)
		for _, tc := range []struct {
			name string
			call func() error
		}{
			{"get a pod", func() error {
				_, err := cs.CoreV1().Pods(systemNS).Get(ctx, "runnerd-node-a", metav1.GetOptions{})
				return err
			}},
			{"list secrets", func() error { _, err := cs.CoreV1().Secrets(systemNS).List(ctx, metav1.ListOptions{}); return err }},
			{"get the token secret", func() error {
				_, err := cs.CoreV1().Secrets(systemNS).Get(ctx, "runnerd-token", metav1.GetOptions{})
				return err
			}},
			{"create a pod", func() error {
				_, err := cs.CoreV1().Pods(systemNS).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}}}, metav1.CreateOptions{})
				return err
			}},
			{"delete a pod", func() error {
				return cs.CoreV1().Pods(systemNS).Delete(ctx, "runnerd-node-a", metav1.DeleteOptions{GracePeriodSeconds: &zero})
			}},
			{"cordon a node", func() error {
				_, err := cs.CoreV1().Nodes().Patch(ctx, "node-a", "application/merge-patch+json", []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{})
				return err
			}},
			{"update pod status", func() error {
				po, err := c.admin.CoreV1().Pods(systemNS).Get(ctx, "runnerd-node-a", metav1.GetOptions{})
				if err != nil {
					return fmt.Errorf("admin get: %w", err)
				}
				_, err = cs.CoreV1().Pods(systemNS).UpdateStatus(ctx, po, metav1.UpdateOptions{})
				return err
			}},
			{"list daemonsets", func() error { _, err := cs.AppsV1().DaemonSets(systemNS).List(ctx, metav1.ListOptions{}); return err }},
		} {
			err := tc.call()
			if !apierrors.IsForbidden(err) || statusCode(err) != 403 {
				t.Errorf("%s with the discovery's token: got %v (status %d), want 403 Forbidden", tc.name, err, statusCode(err))
			}
		}
		// The installer's service account is bound to nothing: a discovery
		// running with its token fails at once with the server's 403
		// instead of waiting out its context on caches that never sync.
		start := time.Now()
		short, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		d, err := k8s.New(short, c.clientset(c.token(ctx, "runnerd-installer")), k8s.Options{Namespace: systemNS, Selector: c.selector, Port: port, Token: token})
		if err == nil {
			d.Close()
			t.Fatal("discovery with a token bound to no role: New succeeded")
		}
		if !apierrors.IsForbidden(err) || time.Since(start) > 30*time.Second {
			t.Errorf("discovery with a token bound to no role: got %v after %s, want a 403 Forbidden well before its context ends", err, time.Since(start).Round(time.Millisecond))
		}
	})

	t.Run("410 Gone", func(t *testing.T) {
		// The API server goes away (the discovery's dials are refused,
		// its watches end) while node-a's pod goes, node-b is cordoned and
		// node-d joins; etcd's history is compacted and the API server
		// restarts, so its watch cache starts at the present. On a refused
		// dial the informers retry their watch from their last resource
		// version; that watch can only be answered 410 Gone, after which
		// they must relist.
		c.srv.Cut()
		mark := reqs.len()
		zero := int64(0)
		if err := c.admin.CoreV1().Pods(systemNS).Delete(ctx, "runnerd-node-a", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		c.cordon(ctx, "node-b", true)
		startRunnerd(t, net.JoinHostPort("127.0.0.4", portS))
		c.addNode(ctx, "node-d", "127.0.0.4")
		c.addPod(ctx, "node-d")
		rev, err := c.srv.CompactEtcd(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.srv.RestartAPIServer(ctx)
		c.srv.Heal()
		nd := k8s.NodeRunnerName("node-d")
		want := sorted(route(nb, "127.0.0.2", true), route(nc, "127.0.0.3", false), route(nd, "127.0.0.4", false))
		took := waitFor(t, "the informers relist after 410", 2*time.Minute, runnersAre(want))
		t.Logf("discovery right again %s after the API server came back; etcd compacted at revision %d", took, rev)
		waitFor(t, "the pool follows", 10*time.Second, poolIs(nc, nd))
		if got, _ := place(6); got[nc]+got[nd] != 6 {
			t.Errorf("placements after the relist = %v, want all on %s and %s", got, nc, nd)
		}

		// What the informers did, in order: the pod informer's first
		// request to reach the new server is a watch from its old resource
		// version (not a list), and a list follows it (client-go's
		// streaming list, a watch with sendInitialEvents, or a plain one).
		var rewatch, relist = -1, -1
		after := reqs.since(mark)
		for i, r := range after {
			if r.err != "" {
				continue
			}
			if rewatch < 0 {
				if !r.watch {
					t.Fatalf("the pod informer's first request to reach the restarted server: %s, want a watch from its last resource version; requests since the cut:\n%s", r, joinReqs(after))
				}
				rewatch = i
				continue
			}
			if !r.watch {
				relist = i
				break
			}
		}
		if rewatch < 0 || relist < 0 {
			t.Fatalf("no rewatch followed by a relist of pods; requests since the cut:\n%s", joinReqs(after))
		}
		old := after[rewatch].rv
		if n, err := strconv.ParseInt(old, 10, 64); err != nil || n >= rev {
			t.Fatalf("rewatch from resource version %q, want one below the compaction at %d", old, rev)
		}
		// The answer that watch had, asked again with the same token.
		w, err := c.clientset(discToken).CoreV1().Pods(systemNS).Watch(ctx, metav1.ListOptions{LabelSelector: c.selector, ResourceVersion: old, AllowWatchBookmarks: true})
		if err == nil {
			select {
			case ev := <-w.ResultChan():
				if st, ok := ev.Object.(*metav1.Status); ev.Type == watch.Error && ok {
					err = apierrors.FromObject(st)
				} else {
					err = fmt.Errorf("first event %s %T", ev.Type, ev.Object)
				}
			case <-time.After(30 * time.Second):
				err = errors.New("no event in 30s")
			}
			w.Stop()
		}
		if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) || statusCode(err) != 410 {
			t.Fatalf("watch from resource version %s after compaction and restart: got %v (status %d), want 410 Gone", old, err, statusCode(err))
		}
		t.Logf("rewatch from %s answered %v; then %s", old, err, after[relist])
	})
}

// podRequest is one request of the discovery for the runner pods.
type podRequest struct {
	watch  bool   // a watch from rv, not a (streaming) list
	list   string // "list", or "watchlist": a watch with sendInitialEvents, client-go's streaming list
	rv     string
	status int
	err    string
}

func (r podRequest) String() string {
	verb := r.list
	if r.watch {
		verb = "watch"
	}
	if r.err != "" {
		return fmt.Sprintf("%s pods rv=%q: %s", verb, r.rv, r.err)
	}
	return fmt.Sprintf("%s pods rv=%q: %d", verb, r.rv, r.status)
}

func joinReqs(rs []podRequest) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintln(&b, r)
	}
	return b.String()
}

// requestLog records the discovery's requests for pods, through its
// client's transport.
type requestLog struct {
	mu   sync.Mutex // guards reqs
	reqs []podRequest
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if strings.HasSuffix(req.URL.Path, "/pods") {
			q := req.URL.Query()
			r := podRequest{rv: q.Get("resourceVersion")}
			switch {
			case q.Get("watch") != "true":
				r.list = "list"
			case q.Get("sendInitialEvents") == "true":
				r.list = "watchlist"
			default:
				r.watch = true
			}
			if err != nil {
				r.err = err.Error()
			} else {
				r.status = resp.StatusCode
			}
			l.mu.Lock()
			l.reqs = append(l.reqs, r)
			l.mu.Unlock()
		}
		return resp, err
	})
}

func (l *requestLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.reqs)
}

func (l *requestLog) since(i int) []podRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs[i:])
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
