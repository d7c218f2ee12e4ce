// Package k8s holds the Kubernetes manifests of a runnerd fleet (an
// installer DaemonSet and the discovery RBAC, rendered with kubectl
// kustomize) and the test that holds them to what the fleet needs.
package k8s

import (
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/agentrunner/runner/internal/testcap"
)

// render returns the documents `kubectl kustomize .` renders.
func render(t *testing.T) [][]byte {
	t.Helper()
	if _, err := exec.LookPath("kubectl"); err != nil {
		testcap.Skip(t, "kubectl", "renders the kustomization with kubectl kustomize")
	}
	out, err := exec.Command("kubectl", "kustomize", ".").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("kubectl kustomize: %v\n%s", err, stderr)
	}
	var docs [][]byte
	for _, d := range bytes.Split(out, []byte("\n---\n")) {
		if len(bytes.TrimSpace(d)) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

// objects decodes every rendered document strictly (an unknown or
// misspelt field fails) into its Kubernetes API type.
type objects struct {
	ds      *appsv1.DaemonSet
	roles   []rbacv1.ClusterRole
	binds   []rbacv1.ClusterRoleBinding
	cms     map[string]corev1.ConfigMap // by name prefix before the hash
	secrets map[string]corev1.Secret
	sas     map[string]corev1.ServiceAccount
}

func decode(t *testing.T, docs [][]byte) objects {
	t.Helper()
	o := objects{cms: map[string]corev1.ConfigMap{}, secrets: map[string]corev1.Secret{}, sas: map[string]corev1.ServiceAccount{}}
	for _, d := range docs {
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(d, &meta); err != nil {
			t.Fatalf("decode kind: %v\n%s", err, d)
		}
		strict := func(v any) {
			t.Helper()
			if err := yaml.UnmarshalStrict(d, v); err != nil {
				t.Fatalf("decode %s strictly: %v\n%s", meta.Kind, err, d)
			}
		}
		switch meta.Kind {
		case "DaemonSet":
			if o.ds != nil {
				t.Fatal("two DaemonSets")
			}
			o.ds = &appsv1.DaemonSet{}
			strict(o.ds)
		case "ClusterRole":
			var v rbacv1.ClusterRole
			strict(&v)
			o.roles = append(o.roles, v)
		case "ClusterRoleBinding":
			var v rbacv1.ClusterRoleBinding
			strict(&v)
			o.binds = append(o.binds, v)
		case "ConfigMap":
			var v corev1.ConfigMap
			strict(&v)
			o.cms[v.Name] = v
		case "Secret":
			var v corev1.Secret
			strict(&v)
			o.secrets[v.Name] = v
		case "ServiceAccount":
			var v corev1.ServiceAccount
			strict(&v)
			o.sas[v.Name] = v
		case "Namespace":
			strict(&corev1.Namespace{})
		default:
			t.Errorf("unexpected kind %q", meta.Kind)
		}
	}
	if o.ds == nil {
		t.Fatal("no DaemonSet rendered")
	}
	return o
}

// TestManifests decodes the rendered manifests into the API types and
// checks what the fleet depends on.
func TestManifests(t *testing.T) {
	o := decode(t, render(t))
	ds := o.ds
	spec := ds.Spec.Template.Spec
	if ds.Namespace != "runner-system" {
		t.Errorf("DaemonSet namespace %q, want runner-system", ds.Namespace)
	}
	// The discovery selector (client/fleet/k8s Options.Selector) matches
	// the pods.
	if ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "runnerd" ||
		ds.Spec.Template.Labels["app.kubernetes.io/name"] != "runnerd" {
		t.Errorf("selector %v, pod labels %v: want app.kubernetes.io/name=runnerd on both", ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	}
	if !spec.HostNetwork {
		t.Error("hostNetwork is off: discovery addresses runnerd at the host IP")
	}
	if !spec.HostPID {
		t.Error("hostPID is off: the installer cannot nsenter the host's systemd")
	}
	if _, ok := o.sas[spec.ServiceAccountName]; !ok {
		t.Errorf("serviceAccountName %q is not rendered", spec.ServiceAccountName)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want the installer alone", len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the installer is not privileged")
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.Exec == nil || !slices.Contains(c.ReadinessProbe.Exec.Command, "version") {
		t.Errorf("readiness probe %+v: want runner asking runnerd over its socket", c.ReadinessProbe)
	}
	if env := envOf(c, "RUNNERD_STATE"); env != "/var/lib/runnerd" {
		t.Errorf("RUNNERD_STATE = %q, want /var/lib/runnerd (the probe finds the socket there)", env)
	}
	// hostPath volumes: the exact paths and types.
	want := map[string]struct {
		path  string
		typ   corev1.HostPathType
		mount string
	}{
		"host-root": {"/", corev1.HostPathDirectory, "/host"},
		"state":     {"/var/lib/runnerd", corev1.HostPathDirectoryOrCreate, "/var/lib/runnerd"},
	}
	var hostFiles string
	tlsMounted := false
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			hostFiles = v.ConfigMap.Name
			continue
		}
		if v.Secret != nil {
			// runnerd's TLS material comes from a Secret that cert-manager
			// or the operator makes (not rendered: it holds a key).
			if v.Secret.SecretName != "runnerd-tls" || !mounted(c, v.Name, "/opt/runner/tls") {
				t.Errorf("secret volume %q (%s): want runnerd-tls at /opt/runner/tls", v.Name, v.Secret.SecretName)
			}
			tlsMounted = true
			continue
		}
		w, ok := want[v.Name]
		if !ok || v.HostPath == nil {
			t.Errorf("volume %q: not an expected hostPath", v.Name)
			continue
		}
		if v.HostPath.Path != w.path || v.HostPath.Type == nil || *v.HostPath.Type != w.typ {
			var got corev1.HostPathType
			if v.HostPath.Type != nil {
				got = *v.HostPath.Type
			}
			t.Errorf("volume %q: hostPath %q type %q, want %q type %q", v.Name, v.HostPath.Path, got, w.path, w.typ)
		}
		if !mounted(c, v.Name, w.mount) {
			t.Errorf("volume %q is not mounted at %s", v.Name, w.mount)
		}
		delete(want, v.Name)
	}
	for name := range want {
		t.Errorf("hostPath volume %q missing", name)
	}
	if !tlsMounted {
		t.Error("no runnerd-tls Secret volume: runnerd would serve the cluster without TLS")
	}
	// Upgrades roll: the image is pinned by a tag other than latest or by
	// a digest, so a new one changes the pod spec.
	if img := c.Image; strings.HasSuffix(img, ":latest") || !(strings.Contains(img, "@sha256:") || strings.LastIndex(img, ":") > strings.LastIndex(img, "/")) {
		t.Errorf("installer image %q: want it pinned by tag or digest", img)
	}
	// One node at a time and no surge: the fleet keeps N-1 nodes.
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "1" ||
		ru.MaxSurge == nil || ru.MaxSurge.String() != "0" {
		t.Errorf("update strategy %+v: want RollingUpdate, maxUnavailable 1, maxSurge 0", ds.Spec.UpdateStrategy)
	}
	// The unit written to the host is systemd/runnerd.service, byte for
	// byte, with the two settings sessions' survival rests on.
	cm, ok := o.cms[hostFiles]
	if !ok {
		t.Fatalf("configMap %q of the host files is not rendered", hostFiles)
	}
	unit := cm.Data["runnerd.service"]
	src, err := os.ReadFile("../../systemd/runnerd.service")
	if err != nil {
		t.Fatal(err)
	}
	if unit != string(src) {
		t.Error("deploy/k8s/runnerd.service differs from systemd/runnerd.service: copy it again")
	}
	for _, line := range []string{"KillMode=process", "Delegate=yes"} {
		if !hasLine(unit, line) {
			t.Errorf("the unit lacks %s", line)
		}
	}
	if !hasLine(cm.Data["fleet.conf"], "Environment=RUNNERD_LISTEN=0.0.0.0:7323") {
		t.Error("fleet.conf does not make runnerd listen on the node's address")
	}
	for _, line := range []string{
		"Environment=RUNNERD_TLS_CERT=/etc/runnerd/tls/tls.crt",
		"Environment=RUNNERD_TLS_KEY=/etc/runnerd/tls/tls.key",
		"Environment=RUNNERD_TLS_CLIENT_CA=/etc/runnerd/tls/ca.crt",
	} {
		if !hasLine(cm.Data["fleet.conf"], line) {
			t.Errorf("fleet.conf lacks %s", line)
		}
	}
	if strings.Contains(cm.Data["fleet.conf"], "INSECURE") {
		t.Error("fleet.conf serves plain HTTP")
	}
	if !strings.Contains(cm.Data["install-host.sh"], "systemctl restart runnerd.service") {
		t.Error("install-host.sh does not restart the host unit")
	}
	// The token comes from the rendered Secret.
	var tokenRef string
	for _, e := range c.Env {
		if e.Name == "RUNNERD_TOKEN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			tokenRef = e.ValueFrom.SecretKeyRef.Name
		}
	}
	if _, ok := o.secrets[tokenRef]; !ok {
		t.Errorf("RUNNERD_TOKEN from secret %q, which is not rendered", tokenRef)
	}
	// Discovery's RBAC: list/watch pods, get nodes, bound to a subject.
	if len(o.roles) != 1 || len(o.binds) != 1 {
		t.Fatalf("%d ClusterRoles, %d bindings; want one each", len(o.roles), len(o.binds))
	}
	allowed := func(res, verb string) bool {
		for _, r := range o.roles[0].Rules {
			if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, res) && slices.Contains(r.Verbs, verb) {
				return true
			}
		}
		return false
	}
	// Exactly what client/fleet/k8s's informers do: list and watch pods
	// and nodes (its lookups are in the informers' caches).
	for _, rv := range [][2]string{{"pods", "list"}, {"pods", "watch"}, {"nodes", "list"}, {"nodes", "watch"}} {
		if !allowed(rv[0], rv[1]) {
			t.Errorf("discovery role does not allow %s %s", rv[1], rv[0])
		}
	}
	for _, r := range o.roles[0].Rules {
		for _, v := range r.Verbs {
			if !slices.Contains([]string{"list", "watch"}, v) {
				t.Errorf("discovery role allows %s on %v: the discovery only lists and watches", v, r.Resources)
			}
		}
	}
	if b := o.binds[0]; b.RoleRef.Name != o.roles[0].Name || len(b.Subjects) != 1 {
		t.Errorf("binding %+v does not bind the discovery role to one subject", b)
	} else if _, ok := o.sas[b.Subjects[0].Name]; !ok || b.Subjects[0].Namespace != "runner-system" {
		t.Errorf("binding subject %+v is not a rendered service account", b.Subjects[0])
	}
}

// TestStrictDecodingRejects shows the decoding is strict: a misspelt
// field (hostNetwrok) fails instead of being dropped.
func TestStrictDecodingRejects(t *testing.T) {
	bad := []byte("apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      hostNetwrok: true\n")
	if err := yaml.UnmarshalStrict(bad, &appsv1.DaemonSet{}); err == nil {
		t.Error("a misspelt field decoded without error")
	}
}

func envOf(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func mounted(c corev1.Container, vol, path string) bool {
	for _, m := range c.VolumeMounts {
		if m.Name == vol && m.MountPath == path {
			return true
		}
	}
	return false
}

func hasLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}
