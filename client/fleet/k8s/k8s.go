// Package k8s is fleet discovery over Kubernetes: the runners are the
// pods of runnerd's installer DaemonSet (deploy/k8s), found by label.
//
// A pod is a runner while it is Running, Ready and not being deleted; on
// a cordoned node (node.spec.unschedulable) it is listed Cordoned: it
// takes no new sandboxes but keeps serving its own. Its address is the node's host IP (the
// installer runs on the host network and runnerd is a host service), or
// the pod IP for a pod that is not host-networked. Its runner name is
// derived from the node's name, so a sandbox keeps its route across pod
// restarts, upgrades and cordons: the sandbox lives on the host, and so
// does the name.
//
// Pods and nodes are watched through client-go informers; Runners answers
// from their caches, so it costs no API request, and every event is a
// notice on Changed, so the pool learns of a cordon or a NotReady node
// at once rather than at its next refresh. Only this package of the
// module depends on Kubernetes modules.
package k8s

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/client/fleet"
)

// DefaultPort is runnerd's TCP port on each host (daemon.DefaultListen's).
const DefaultPort = 7323

// Options say where the runners are. Selector is required.
type Options struct {
	// Namespace of the DaemonSet; "" watches every namespace.
	Namespace string
	// Selector is the label selector of the DaemonSet's pods, e.g.
	// "app.kubernetes.io/name=runnerd".
	Selector string
	// Port is runnerd's TCP port on the host; 0 means DefaultPort.
	Port int
	// Token is the bearer token the fleet's runnerds share
	// (RUNNERD_TOKEN of the unit, from a Secret).
	Token string
	// Name maps a node name to its runner name (1-20 of [a-z0-9]); nil
	// means NodeRunnerName.
	Name func(node string) string
	// Resync is the informers' resync period; 0 is none (watch only).
	Resync time.Duration
	// PlainHTTP routes to http:// instead of https://, for a fleet whose
	// runnerds serve plain HTTP (--insecure-listen). Routes are https by
	// default: deploy/k8s gives every runnerd a certificate. The pool's
	// client options (fleet.Options.Adapter.Client: RootCAs, Certificate)
	// say how to verify it and which client certificate to present.
	PlainHTTP bool
}

// NodeRunnerName is the default runner name of a node: "n" and the first
// 12 hex digits of the SHA-256 of its name. Node names may hold dots and
// dashes and be longer than a runner name, so they are hashed; the hash
// is stable, so the route is.
func NodeRunnerName(node string) string {
	sum := sha256.Sum256([]byte(node))
	return "n" + hex.EncodeToString(sum[:6])
}

// Kubernetes is a fleet.Discovery that watches the DaemonSet's pods and
// the nodes. It is safe for concurrent use; Close stops its informers and
// waits for them.
type Kubernetes struct {
	opts  Options
	sel   labels.Selector
	pods  listersv1.PodLister
	nodes listersv1.NodeLister

	changed chan struct{} // one pending notice of a pod or node event

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

var _ fleet.Notifier = (*Kubernetes)(nil)

var _ fleet.Discovery = (*Kubernetes)(nil)

// New starts watching pods matching opts.Selector and nodes through cs,
// and returns once both caches are synced. It fails when ctx ends first,
// or at once when the API server refuses the list or watch (401, 403:
// the error wraps the server's, so apierrors.IsForbidden holds). The
// caller must Close it.
func New(ctx context.Context, cs kubernetes.Interface, opts Options) (*Kubernetes, error) {
	if opts.Selector == "" {
		return nil, errors.New("k8s discovery: a pod label selector is required")
	}
	sel, err := labels.Parse(opts.Selector)
	if err != nil {
		return nil, fmt.Errorf("parse selector %q: %w", opts.Selector, err)
	}
	if opts.Port == 0 {
		opts.Port = DefaultPort
	}
	if opts.Name == nil {
		opts.Name = NodeRunnerName
	}
	podF := informers.NewSharedInformerFactoryWithOptions(cs, opts.Resync,
		informers.WithNamespace(opts.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = sel.String() }))
	nodeF := informers.NewSharedInformerFactory(cs, opts.Resync)
	k := &Kubernetes{
		opts:    opts,
		sel:     sel,
		pods:    podF.Core().V1().Pods().Lister(),
		nodes:   nodeF.Core().V1().Nodes().Lister(),
		stop:    make(chan struct{}),
		changed: make(chan struct{}, 1),
	}
	// Every add, update and delete of a pod or node is a notice (the
	// caches hold it before the handler runs); notices coalesce, so a burst
	// costs the pool one refresh.
	notify := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.notify() },
		UpdateFunc: func(any, any) { k.notify() },
		DeleteFunc: func(any) { k.notify() },
	}
	// A refusal (401, 403) does not end an informer: its reflector logs it
	// and retries with backoff, and the caches never sync. Until they
	// have, New fails on the first refusal with the server's own error,
	// rather than waiting out ctx and reporting only a deadline.
	refused := make(chan error, 1)
	onWatchError := func(ctx context.Context, r *cache.Reflector, err error) {
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			select {
			case refused <- err:
			default:
			}
		}
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}
	for what, inf := range map[string]cache.SharedIndexInformer{
		"pods":  podF.Core().V1().Pods().Informer(),
		"nodes": nodeF.Core().V1().Nodes().Informer(),
	} {
		if _, err := inf.AddEventHandler(notify); err != nil {
			return nil, fmt.Errorf("watch %s: %w", what, err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(onWatchError); err != nil {
			return nil, fmt.Errorf("watch %s: %w", what, err)
		}
	}
	podF.Start(k.stop)
	nodeF.Start(k.stop)
	// The factories' goroutines end on stop; Shutdown waits for them.
	k.wg.Go(func() { <-k.stop; podF.Shutdown() })
	k.wg.Go(func() { <-k.stop; nodeF.Shutdown() })
	synced := make(chan struct{})
	go func() { // ends when the caches sync or stop closes
		defer close(synced)
		cache.WaitForCacheSync(k.stop,
			podF.Core().V1().Pods().Informer().HasSynced,
			nodeF.Core().V1().Nodes().Informer().HasSynced)
	}()
	select {
	case <-synced:
		return k, nil
	case err := <-refused:
		k.Close()
		<-synced
		return nil, fmt.Errorf("list and watch pods and nodes: %w", err)
	case <-ctx.Done():
		k.Close()
		<-synced
		return nil, fmt.Errorf("sync pod and node caches: %w", ctx.Err())
	}
}

func (k *Kubernetes) notify() {
	select {
	case k.changed <- struct{}{}:
	default: // one is pending already
	}
}

// Changed receives a value after pods or nodes changed (fleet.Notifier):
// the pool refreshes at once instead of at its next tick.
func (k *Kubernetes) Changed() <-chan struct{} { return k.changed }

// Close stops the informers and waits for them. It is idempotent.
func (k *Kubernetes) Close() error {
	k.closeOnce.Do(func() {
		close(k.stop)
		k.wg.Wait()
	})
	return nil
}

// Runners returns the runners, sorted by name, from the informers'
// caches.
func (k *Kubernetes) Runners(context.Context) ([]fleet.Runner, error) {
	pods, err := k.pods.List(k.sel)
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	byName := map[string]fleet.Runner{}
	for _, p := range pods {
		if k.opts.Namespace != "" && p.Namespace != k.opts.Namespace {
			continue
		}
		if !serving(p) {
			continue
		}
		node, err := k.nodes.Get(p.Spec.NodeName)
		if err != nil {
			continue // an unknown node: nothing says it serves
		}
		ip := p.Status.PodIP
		if p.Spec.HostNetwork {
			ip = p.Status.HostIP
		}
		if ip == "" {
			continue
		}
		name := k.opts.Name(p.Spec.NodeName)
		scheme := "https://"
		if k.opts.PlainHTTP {
			scheme = "http://"
		}
		byName[name] = fleet.Runner{
			Endpoint: client.Endpoint{
				Name:  name,
				URL:   scheme + net.JoinHostPort(ip, strconv.Itoa(k.opts.Port)),
				Token: k.opts.Token,
			},
			// A node that is not Ready (kubelet silent, the host in
			// trouble) takes no new sandboxes either; its pod may still
			// read Ready until the node controller evicts it.
			Cordoned: node.Spec.Unschedulable || !nodeReady(node),
		}
	}
	out := make([]fleet.Runner, 0, len(byName))
	for _, ep := range byName {
		out = append(out, ep)
	}
	slices.SortFunc(out, func(a, b fleet.Runner) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out, nil
}

// serving reports whether p is Running, Ready and not being deleted.
func serving(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Spec.NodeName == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodeReady reports whether n's Ready condition is True. A node without
// one (as a fake or a just-registered node has) counts as ready: only a
// reported NotReady or Unknown takes it out of placement.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return true
}
