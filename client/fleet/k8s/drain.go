package k8s

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
)

// DrainAnnotation, set to DrainMove on a cordoned node, asks the control
// plane to move the node's parked sandboxes to other nodes (package
// client/fleet/move: Mover.DrainMarked over Kubernetes.Draining). A node
// that is only cordoned keeps its sandboxes; one annotated but not
// cordoned is ignored (placement would send new sandboxes back to it).
const (
	DrainAnnotation = "runner.dev/drain"
	DrainMove       = "move"
)

// Draining returns the runner names of the nodes that are cordoned
// (spec.unschedulable) and annotated DrainAnnotation=DrainMove, from the
// informers' cache, sorted. It needs no permission beyond the discovery's
// list and watch on nodes.
func (k *Kubernetes) Draining(context.Context) ([]string, error) {
	nodes, err := k.nodes.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var out []string
	for _, n := range nodes {
		if n.Spec.Unschedulable && n.Annotations[DrainAnnotation] == DrainMove {
			out = append(out, k.opts.Name(n.Name))
		}
	}
	slices.Sort(out)
	return out, nil
}
