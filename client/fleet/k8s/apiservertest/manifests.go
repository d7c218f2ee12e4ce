package apiservertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// Decode parses a multi-document YAML manifest into typed objects of
// client-go's scheme.
func Decode(manifest []byte) ([]runtime.Object, error) {
	var objs []runtime.Object
	for i, doc := range bytes.Split(manifest, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decode document %d: %w", i, err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

// Create creates objs through cs, putting namespaced objects without a
// namespace in namespace (as kustomize's namespace: does). It knows the
// kinds deploy/k8s holds.
func Create(ctx context.Context, cs kubernetes.Interface, namespace string, objs ...runtime.Object) error {
	ns := func(m *metav1.ObjectMeta) string {
		if m.Namespace == "" {
			m.Namespace = namespace
		}
		return m.Namespace
	}
	c := metav1.CreateOptions{}
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = cs.CoreV1().Namespaces().Create(ctx, o, c)
		case *corev1.ServiceAccount:
			_, err = cs.CoreV1().ServiceAccounts(ns(&o.ObjectMeta)).Create(ctx, o, c)
		case *rbacv1.ClusterRole:
			_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, c)
		case *rbacv1.ClusterRoleBinding:
			_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, c)
		case *appsv1.DaemonSet:
			_, err = cs.AppsV1().DaemonSets(ns(&o.ObjectMeta)).Create(ctx, o, c)
		default:
			return fmt.Errorf("create %T: kind not known to apiservertest", obj)
		}
		if err != nil {
			return fmt.Errorf("create %T: %w", obj, err)
		}
	}
	return nil
}

func randHex(t testing.TB) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
