// Package k8s tests shardstock's Kubernetes manifests: every overlay is
// rendered with the kustomize library and every object decoded strictly
// into its API type (an unknown field or kind fails), then checked against
// the deployment's invariants.
package k8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

var overlays = []string{"overlays/dev", "overlays/prod"}

// Ports of shardstock's processes (the flags' values in base/).
const (
	shardPort    = 7001 // the ShardService's port: internal only
	operatorPort = 9090 // /metrics, /healthz, /readyz of every process
)

// rendered is one overlay's objects, decoded.
type rendered struct {
	deployments  []*appsv1.Deployment
	statefulSets []*appsv1.StatefulSet
	services     []*corev1.Service
	hpas         []*autoscalingv2.HorizontalPodAutoscaler
	pdbs         []*policyv1.PodDisruptionBudget
	policies     []*networkingv1.NetworkPolicy
	secrets      []*corev1.Secret
	clusters     []*cnpgCluster
	rules        []*monitoringv1.PrometheusRule
	monitors     []*monitoringv1.ServiceMonitor
	configMaps   []*corev1.ConfigMap
	issuers      []*certIssuer
	certificates []*certificate
	kinds        map[string]int
}

// render builds an overlay with kustomize and decodes every object.
func render(t *testing.T, dir string) *rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resMap, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	out, err := resMap.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	r := &rendered{kinds: map[string]int{}}
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		if err := r.add(doc); err != nil {
			t.Errorf("%s: %v\n%s", dir, err, doc)
		}
	}
	return r
}

// add decodes doc strictly into the type its apiVersion and kind name.
func (r *rendered) add(doc []byte) error {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return err
	}
	gvk := head.APIVersion + "/" + head.Kind
	r.kinds[head.Kind]++
	switch gvk {
	case "v1/Namespace":
		return decode(doc, new([]*corev1.Namespace))
	case "v1/Service":
		return decode(doc, &r.services)
	case "v1/Secret":
		return decode(doc, &r.secrets)
	case "v1/ConfigMap":
		return decode(doc, &r.configMaps)
	case "apps/v1/Deployment":
		return decode(doc, &r.deployments)
	case "apps/v1/StatefulSet":
		return decode(doc, &r.statefulSets)
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return decode(doc, &r.hpas)
	case "policy/v1/PodDisruptionBudget":
		return decode(doc, &r.pdbs)
	case "networking.k8s.io/v1/NetworkPolicy":
		return decode(doc, &r.policies)
	case "postgresql.cnpg.io/v1/Cluster":
		return decode(doc, &r.clusters)
	case "monitoring.coreos.com/v1/PrometheusRule":
		return decode(doc, &r.rules)
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return decode(doc, &r.monitors)
	case "cert-manager.io/v1/Issuer":
		return decode(doc, &r.issuers)
	case "cert-manager.io/v1/Certificate":
		return decode(doc, &r.certificates)
	}
	return fmt.Errorf("unknown kind %s: add its type to the test", gvk)
}

// decode decodes doc strictly (an unknown field fails) into a new T and
// appends it to list.
func decode[T any](doc []byte, list *[]*T) error {
	v := new(T)
	*list = append(*list, v)
	return yaml.UnmarshalStrict(doc, v)
}

// pods are the pod templates of every workload, by workload name.
func (r *rendered) pods() map[string]*corev1.PodTemplateSpec {
	out := map[string]*corev1.PodTemplateSpec{}
	for _, d := range r.deployments {
		out["Deployment/"+d.Name] = &d.Spec.Template
	}
	for _, s := range r.statefulSets {
		out["StatefulSet/"+s.Name] = &s.Spec.Template
	}
	return out
}

func TestOverlays(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			checkPods(t, r)
			checkServices(t, r)
			checkScaling(t, r)
			checkNetworkPolicies(t, r)
		})
	}
}

// checkPods: every container has liveness and readiness probes, resource
// requests and limits, a pinned image, runs as non-root, and takes every
// secret by reference.
func checkPods(t *testing.T, r *rendered) {
	for name, tmpl := range r.pods() {
		spec := tmpl.Spec
		if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("%s: pod does not set runAsNonRoot", name)
		}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			where := name + "/" + c.Name
			if c.LivenessProbe == nil || c.ReadinessProbe == nil {
				t.Errorf("%s: liveness and readiness probes required", where)
			}
			for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if _, ok := c.Resources.Requests[res]; !ok {
					t.Errorf("%s: no %s request", where, res)
				}
				if _, ok := c.Resources.Limits[res]; !ok {
					t.Errorf("%s: no %s limit", where, res)
				}
			}
			if err := pinned(c.Image); err != nil {
				t.Errorf("%s: %v", where, err)
			}
			for _, e := range c.Env {
				if secretish(e.Name) && e.Value != "" && (e.ValueFrom != nil || !onlyReferences(e.Value)) {
					t.Errorf("%s: env %s holds a literal value; take it from a Secret (secretKeyRef)", where, e.Name)
				}
			}
		}
	}
}

// pinned reports why an image reference is not pinned to a version.
func pinned(image string) error {
	if strings.Contains(image, "@sha256:") {
		return nil
	}
	slash := strings.LastIndex(image, "/")
	colon := strings.LastIndex(image, ":")
	if colon <= slash {
		return fmt.Errorf("image %q has no tag", image)
	}
	if tag := image[colon+1:]; tag == "latest" || tag == "" {
		return fmt.Errorf("image %q is not pinned", image)
	}
	return nil
}

// secretish names an environment variable that carries a credential.
func secretish(name string) bool {
	for _, s := range []string{"TOKEN", "PASSWORD", "DATABASE_URL", "DATABASES", "SECRET", "_URL"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// onlyReferences reports whether v is built from $(VAR) references with no
// credential of its own (such as "second=$(SECOND_URL)").
func onlyReferences(v string) bool {
	if _, rest, isURL := strings.Cut(v, "://"); isURL {
		// A URL may be literal but for its credentials: user and password
		// each a $(VAR) reference to an earlier variable from a Secret.
		userinfo, _, ok := strings.Cut(rest, "@")
		return ok && strings.Trim(references.ReplaceAllString(userinfo, ""), ":") == "" && references.MatchString(userinfo)
	}
	return strings.Contains(v, "$(") && !strings.Contains(v, "@")
}

// references matches a $(VAR) reference of a container's environment.
var references = regexp.MustCompile(`\$\([A-Z_][A-Z0-9_]*\)`)

// checkServices: no Service exposes the shard servers' port or selects
// them outside the cluster; the allocators' Service exposes the public
// port only.
func checkServices(t *testing.T, r *rendered) {
	podLabels := map[string]labels.Set{}
	for name, tmpl := range r.pods() {
		podLabels[name] = tmpl.Labels
	}
	for _, s := range r.services {
		sel := labels.SelectorFromSet(s.Spec.Selector)
		exposed := s.Spec.Type == corev1.ServiceTypeLoadBalancer || s.Spec.Type == corev1.ServiceTypeNodePort
		for _, p := range s.Spec.Ports {
			target := p.TargetPort.IntValue()
			if p.TargetPort.String() == "shard" || p.Port == shardPort || target == shardPort {
				if exposed || s.Spec.ClusterIP != corev1.ClusterIPNone {
					t.Errorf("Service %s exposes the shard port (%d): only a headless Service may name it", s.Name, shardPort)
				}
			}
		}
		if len(s.Spec.Selector) > 0 && sel.Matches(podLabels["StatefulSet/shard"]) && (exposed || s.Spec.ClusterIP != corev1.ClusterIPNone) {
			t.Errorf("Service %s selects the shard servers and is not headless", s.Name)
		}
		if len(s.Spec.Selector) > 0 && sel.Matches(podLabels["Deployment/allocator"]) {
			// The public Service exposes the API only; any other is the
			// operator listener's, inside the cluster, with nothing else.
			want := "http"
			if s.Name != "allocator" {
				want = "ops"
				if exposed {
					t.Errorf("Service %s exposes the allocators' operator port outside the cluster", s.Name)
				}
			}
			for _, p := range s.Spec.Ports {
				if p.TargetPort.String() != want {
					t.Errorf("Service %s exposes allocator port %s, want only %s", s.Name, p.TargetPort.String(), want)
				}
			}
		}
	}
}

// checkScaling: the HPA scales the allocator Deployment; PDBs cover the
// allocators, shard servers and etcd.
func checkScaling(t *testing.T, r *rendered) {
	if len(r.hpas) != 1 || r.hpas[0].Spec.ScaleTargetRef.Kind != "Deployment" || r.hpas[0].Spec.ScaleTargetRef.Name != "allocator" {
		t.Errorf("want one HPA on Deployment allocator, got %d", len(r.hpas))
	}
	pods := r.pods()
	for _, want := range []string{"Deployment/allocator", "StatefulSet/shard", "StatefulSet/etcd"} {
		covered := false
		for _, pdb := range r.pdbs {
			sel, err := metav1LabelSelector(pdb)
			if err == nil && pods[want] != nil && sel.Matches(labels.Set(pods[want].Labels)) {
				covered = true
			}
		}
		if !covered {
			t.Errorf("no PodDisruptionBudget selects %s", want)
		}
	}
	for _, s := range r.statefulSets {
		if s.Name == "etcd" && (s.Spec.Replicas == nil || *s.Spec.Replicas != 3) {
			t.Errorf("etcd has %v members, want 3", s.Spec.Replicas)
		}
		if s.Name == "shard" {
			c := s.Spec.Template.Spec.Containers[0]
			if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.HTTPGet == nil || c.Lifecycle.PreStop.HTTPGet.Path != "/drain" {
				t.Errorf("shard servers: no preStop GET /drain (it hands the partitions over)")
			}
		}
	}
}

// checkNetworkPolicies: the shard port is reachable only from shardstock's
// allocators; the shard servers' operator port (/metrics) only from the
// monitoring namespace; no rule admits anyone to any port, or an IP block.
func checkNetworkPolicies(t *testing.T, r *rendered) {
	pods := r.pods()
	shard, allocator := labels.Set(pods["StatefulSet/shard"].Labels), labels.Set(pods["Deployment/allocator"].Labels)
	found := false
	for _, p := range r.policies {
		sel, err := metav1Selector(&p.Spec.PodSelector)
		if err != nil || !sel.Matches(shard) {
			continue
		}
		found = true
		for _, rule := range p.Spec.Ingress {
			if len(rule.From) == 0 || len(rule.Ports) == 0 {
				t.Errorf("NetworkPolicy %s lets anyone reach the shard servers, or on any port", p.Name)
			}
			for _, port := range rule.Ports {
				for _, from := range rule.From {
					if from.IPBlock != nil {
						t.Errorf("NetworkPolicy %s admits an IP block to the shard servers", p.Name)
					}
					switch port.Port.IntValue() {
					case shardPort:
						// Only pods of this namespace that are allocators.
						psel, err := metav1Selector(from.PodSelector)
						if from.NamespaceSelector != nil || from.PodSelector == nil || err != nil || !psel.Matches(allocator) || psel.Matches(shard) {
							t.Errorf("NetworkPolicy %s admits %+v to the shard port: allocators only", p.Name, from)
						}
					case operatorPort:
						if from.NamespaceSelector == nil || from.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
							t.Errorf("NetworkPolicy %s admits %+v to the shard servers' operator port: the monitoring namespace only", p.Name, from)
						}
					default:
						t.Errorf("NetworkPolicy %s opens port %s of the shard servers", p.Name, port.Port.String())
					}
				}
			}
		}
	}
	if !found {
		t.Error("no NetworkPolicy selects the shard servers")
	}
	// The shard servers' metrics and probes are on the operator port.
	c := pods["StatefulSet/shard"].Spec.Containers[0]
	if env(c)["SHARDSTOCK_SHARD_OPERATOR_ADDR"].Value != fmt.Sprintf("0.0.0.0:%d", operatorPort) || c.ReadinessProbe.HTTPGet.Port.String() != "ops" {
		t.Errorf("shard servers: metrics and probes not on an operator port of their own (SHARDSTOCK_SHARD_OPERATOR_ADDR %q, readiness on %s)",
			env(c)["SHARDSTOCK_SHARD_OPERATOR_ADDR"].Value, c.ReadinessProbe.HTTPGet.Port.String())
	}
}

// env is a container's environment by name.
func env(c corev1.Container) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		out[e.Name] = e
	}
	return out
}

// checkMutualTLS: in prod the shard servers serve TLS with a certificate
// cert-manager issues for the names allocators dial and require a client
// certificate of the same CA; the allocators present one, which only
// allows client authentication; ServiceMonitors scrape operator ports, not
// the shard port; no call that changes stock is opened to the public role.
func checkMutualTLS(t *testing.T, r *rendered) {
	t.Helper()
	certs := map[string]*certificate{}
	for _, c := range r.certificates {
		certs[c.Spec.SecretName] = c
	}
	issuers := map[string]*certIssuer{}
	for _, i := range r.issuers {
		issuers[i.Metadata.Name] = i
	}
	// mounted returns the Certificate whose Secret a pod mounts at dir.
	mounted := func(pod *corev1.PodTemplateSpec, dir string) *certificate {
		vols := map[string]string{}
		for _, v := range pod.Spec.Volumes {
			if v.Secret != nil {
				vols[v.Name] = v.Secret.SecretName
			}
		}
		for _, m := range pod.Spec.Containers[0].VolumeMounts {
			if m.MountPath == dir {
				return certs[vols[m.Name]]
			}
		}
		return nil
	}
	pods := r.pods()
	shard, alloc := pods["StatefulSet/shard"], pods["Deployment/allocator"]
	se, ae := env(shard.Spec.Containers[0]), env(alloc.Spec.Containers[0])
	serving := mounted(shard, path.Dir(se["SHARDSTOCK_TLS_CERT"].Value))
	client := mounted(alloc, path.Dir(ae["SHARDSTOCK_SHARD_TLS_CERT"].Value))
	switch {
	case serving == nil || path.Dir(se["SHARDSTOCK_TLS_KEY"].Value) != path.Dir(se["SHARDSTOCK_TLS_CERT"].Value) ||
		se["SHARDSTOCK_TLS_CLIENT_CA"].Value != path.Dir(se["SHARDSTOCK_TLS_CERT"].Value)+"/ca.crt":
		t.Fatalf("prod shard servers: no TLS certificate of cert-manager with its key and a client CA mounted (SHARDSTOCK_TLS_*: %v)", se)
	case client == nil || ae["SHARDSTOCK_SHARD_TLS_CA"].Value != path.Dir(ae["SHARDSTOCK_SHARD_TLS_CERT"].Value)+"/ca.crt":
		t.Fatalf("prod allocators: no client certificate of cert-manager and CA mounted (SHARDSTOCK_SHARD_TLS_*)")
	}
	if serving.Spec.IssuerRef != client.Spec.IssuerRef || issuers[serving.Spec.IssuerRef.Name] == nil || issuers[serving.Spec.IssuerRef.Name].Spec.CA == nil {
		t.Errorf("the shard servers' and the allocators' certificates are not of one CA issuer: %+v, %+v", serving.Spec.IssuerRef, client.Spec.IssuerRef)
	}
	if !slices.Contains(client.Spec.Usages, "client auth") || slices.Contains(client.Spec.Usages, "server auth") || !slices.Contains(serving.Spec.Usages, "server auth") {
		t.Errorf("usages: allocators %v (want client auth only), shard servers %v (want server auth)", client.Spec.Usages, serving.Spec.Usages)
	}
	// Allocators dial the name a shard server advertises: its certificate
	// must hold it.
	adv, _, _ := strings.Cut(strings.ReplaceAll(se["SHARDSTOCK_ADVERTISE"].Value, "$(SHARDSTOCK_SERVER_ID)", "shard-0"), ":")
	if !slices.ContainsFunc(serving.Spec.DNSNames, func(n string) bool {
		return n == adv || (strings.HasPrefix(n, "*.") && strings.HasSuffix(adv, n[1:]) && !strings.Contains(strings.TrimSuffix(adv, n[1:]), "."))
	}) {
		t.Errorf("shard servers advertise %q, which their certificate's names %v do not cover", adv, serving.Spec.DNSNames)
	}
	if shard.Spec.Containers[0].Lifecycle.PreStop.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Error("prod shard servers: the preStop /drain is not over HTTPS, the only scheme their port speaks")
	}
	for _, m := range r.monitors {
		for _, e := range m.Spec.Endpoints {
			if e.Port != "ops" {
				t.Errorf("ServiceMonitor %s scrapes port %q, want the operator ports (ops) only", m.Name, e.Port)
			}
		}
	}
	checkServiceClientCerts(t, alloc, certs, issuers, serving, mounted)
	for _, name := range []string{"SHARDSTOCK_PUBLIC_CALLS"} {
		if v, ok := ae[name]; ok && (v.Value != "" || v.ValueFrom != nil) {
			t.Errorf("prod allocators set %s: no call that changes stock is opened to the public role", name)
		}
	}
	if slices.ContainsFunc(alloc.Spec.Containers[0].Args, func(a string) bool { return strings.Contains(a, "public-calls") }) {
		t.Error("prod allocators pass -public-calls: no call that changes stock is opened to the public role")
	}
}

// checkServiceClientCerts: in prod the allocators' public port serves TLS
// with a certificate cert-manager issues for the allocator Service's names
// (probed over HTTPS) and takes the service role from client certificates
// of a CA (-service-client-ca) whose certificate, never its key, is
// mounted from the Secret of a cert-manager CA; an Issuer of that CA issues
// client-auth-only certificates for backends; and that CA is not the
// internal one, so that no backend's certificate opens the shard port.
func checkServiceClientCerts(t *testing.T, alloc *corev1.PodTemplateSpec, certs map[string]*certificate, issuers map[string]*certIssuer,
	shardServing *certificate, mounted func(*corev1.PodTemplateSpec, string) *certificate) {
	t.Helper()
	c := alloc.Spec.Containers[0]
	ae := env(c)
	caFile := ae["SHARDSTOCK_SERVICE_CLIENT_CA"].Value
	if caFile == "" {
		t.Fatal("prod allocators: no SHARDSTOCK_SERVICE_CLIENT_CA: service client certificates are not taken")
	}
	// The CA file's volume: a Secret of a cert-manager CA, with the
	// certificate alone projected to the file's name.
	var vol *corev1.Volume
	for _, m := range c.VolumeMounts {
		if m.MountPath == path.Dir(caFile) {
			for i := range alloc.Spec.Volumes {
				if alloc.Spec.Volumes[i].Name == m.Name {
					vol = &alloc.Spec.Volumes[i]
				}
			}
		}
	}
	if vol == nil || vol.Secret == nil {
		t.Fatalf("prod allocators: the service client CA %s is not mounted from a Secret", caFile)
	}
	ca := certs[vol.Secret.SecretName]
	if ca == nil || !ca.Spec.IsCA {
		t.Fatalf("prod allocators: the service client CA's Secret %q is no cert-manager CA Certificate's", vol.Secret.SecretName)
	}
	if len(vol.Secret.Items) == 0 {
		t.Errorf("prod allocators: the whole Secret %q is mounted, its CA's private key with it: project tls.crt alone", vol.Secret.SecretName)
	}
	for _, it := range vol.Secret.Items {
		if it.Key != "tls.crt" && it.Key != "ca.crt" || it.Key == "tls.crt" && it.Path != path.Base(caFile) {
			t.Errorf("prod allocators: the service CA volume projects %s to %s, want the CA's certificate alone at %s", it.Key, it.Path, path.Base(caFile))
		}
	}
	if shardServing != nil {
		if internal := issuers[shardServing.Spec.IssuerRef.Name]; internal != nil && internal.Spec.CA != nil && internal.Spec.CA.SecretName == ca.Spec.SecretName {
			t.Errorf("the service client CA is the internal CA (%s): a backend's certificate would open the shard port", ca.Spec.SecretName)
		}
	}
	var issuer string
	for name, i := range issuers {
		if i.Spec.CA != nil && i.Spec.CA.SecretName == ca.Spec.SecretName {
			issuer = name
		}
	}
	if issuer == "" {
		t.Fatalf("no Issuer of the service client CA (ca.secretName %s): no backend can be issued a certificate", ca.Spec.SecretName)
	}
	clients := 0
	for _, cert := range certs {
		if cert.Spec.IssuerRef.Name != issuer || !slices.Contains(cert.Spec.Usages, "client auth") {
			continue
		}
		clients++
		if slices.Contains(cert.Spec.Usages, "server auth") || cert.Spec.CommonName == "" {
			t.Errorf("service client Certificate %s: usages %v and CN %q, want client auth only and a CN naming the backend", cert.Metadata.Name, cert.Spec.Usages, cert.Spec.CommonName)
		}
	}
	if clients == 0 {
		t.Errorf("no client Certificate of Issuer %s: issue one per backend", issuer)
	}
	// A client certificate comes over TLS: the public port serves it, with
	// a certificate for the names backends dial, and is probed over HTTPS.
	public := mounted(alloc, path.Dir(ae["SHARDSTOCK_TLS_CERT"].Value))
	if public == nil || path.Dir(ae["SHARDSTOCK_TLS_KEY"].Value) != path.Dir(ae["SHARDSTOCK_TLS_CERT"].Value) {
		t.Fatalf("prod allocators: the public port serves no TLS certificate of cert-manager with its key (SHARDSTOCK_TLS_CERT %q)", ae["SHARDSTOCK_TLS_CERT"].Value)
	}
	if !slices.Contains(public.Spec.Usages, "server auth") || !slices.Contains(public.Spec.DNSNames, "allocator.shardstock.svc.cluster.local") {
		t.Errorf("the allocators' serving Certificate %s: usages %v, names %v; want server auth for allocator.shardstock.svc.cluster.local", public.Metadata.Name, public.Spec.Usages, public.Spec.DNSNames)
	}
	for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p.HTTPGet == nil || p.HTTPGet.Port.String() == "http" && p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("prod allocators: the %s probe is not over HTTPS, the only scheme the public port speaks", what)
		}
	}
}

// TestProd: two CloudNativePG clusters with synchronous replication that
// never degrades to asynchronous, shard servers that insist on it, mTLS
// between allocators and shard servers, and the monitoring objects.
func TestProd(t *testing.T) {
	r := render(t, "overlays/prod")
	if len(r.clusters) != 2 {
		t.Fatalf("%d CloudNativePG Clusters, want 2", len(r.clusters))
	}
	for _, c := range r.clusters {
		s := c.Spec.PostgreSQL.Synchronous
		if c.Spec.Instances < 3 || s == nil || s.Number < 1 || s.DataDurability != "required" {
			t.Errorf("Cluster %s: %d instances, synchronous %+v; want 3 instances and at least one synchronous standby, dataDurability required", c.Metadata.Name, c.Spec.Instances, s)
		}
	}
	shard := findSTS(r, "shard")
	env := map[string]corev1.EnvVar{}
	for _, e := range shard.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	if env["SHARDSTOCK_REQUIRE_SYNC_STANDBY"].Value != "1" {
		t.Error("prod shard servers do not set SHARDSTOCK_REQUIRE_SYNC_STANDBY=1")
	}
	if env["SHARDSTOCK_DATABASES"].Value == "" || env["DATABASE_URL"].Value == "" {
		t.Error("prod shard servers are not given both databases")
	}
	checkServiceRole(t, r)
	checkMutualTLS(t, r)
	if len(r.monitors) != 1 || len(r.rules) != 1 {
		t.Errorf("%d ServiceMonitors and %d PrometheusRules, want 1 each", len(r.monitors), len(r.rules))
	}
	if len(r.secrets) != 0 {
		t.Errorf("prod renders %d Secrets: secrets are referenced, never committed", len(r.secrets))
	}
	checkDashboard(t, r)
}

// checkDashboard: prod ships the Grafana board (deploy/grafana) as one
// ConfigMap with the label Grafana's dashboard sidecar watches, holding a
// dashboard with panels (deploy/alerts TestDashboard checks its queries).
func checkDashboard(t *testing.T, r *rendered) {
	t.Helper()
	var boards []*corev1.ConfigMap
	for _, c := range r.configMaps {
		if c.Labels["grafana_dashboard"] == "1" {
			boards = append(boards, c)
		}
	}
	if len(boards) != 1 {
		t.Fatalf("%d ConfigMaps labelled grafana_dashboard: \"1\", want 1", len(boards))
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Type string `json:"type"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(boards[0].Data["shardstock.json"]), &d); err != nil || d.UID == "" || len(d.Panels) == 0 {
		t.Errorf("ConfigMap %s: shardstock.json has uid %q and %d panels (%v), want a dashboard", boards[0].Name, d.UID, len(d.Panels), err)
	}
}

// checkServiceRole: in prod every process serves as a role of its own that
// each Cluster manages and that does not own the schema (so it cannot
// rewrite the ledger), the owner only migrates, and every Postgres URL
// verifies the server's certificate against a CA mounted in the pod.
func checkServiceRole(t *testing.T, r *rendered) {
	t.Helper()
	for _, c := range r.clusters {
		var service bool
		for _, role := range c.Spec.Managed.Roles {
			service = service || (role.Login && role.Name != c.Spec.Bootstrap.InitDB.Owner && role.PasswordSecret.Name != "")
		}
		if !service {
			t.Errorf("Cluster %s manages no login role apart from the owner %q for the service", c.Metadata.Name, c.Spec.Bootstrap.InitDB.Owner)
		}
	}
	for name, pod := range r.pods() {
		if name == "StatefulSet/etcd" {
			continue
		}
		c := pod.Spec.Containers[0]
		env := map[string]corev1.EnvVar{}
		for _, e := range c.Env {
			env[e.Name] = e
		}
		if ref := env["DATABASE_URL"].ValueFrom; ref != nil {
			t.Errorf("%s: DATABASE_URL from %v: the service's URL is built from its own role's Secret", name, ref)
		}
		if env["SHARDSTOCK_MIGRATE_URL"].ValueFrom == nil || env["SHARDSTOCK_MIGRATE_DATABASES"].Value == "" {
			t.Errorf("%s: the schema's owner does not migrate (SHARDSTOCK_MIGRATE_URL, SHARDSTOCK_MIGRATE_DATABASES)", name)
		}
		mounted := map[string]bool{}
		for _, m := range c.VolumeMounts {
			mounted[m.MountPath] = true
		}
		for _, key := range []string{"DATABASE_URL", "SECOND_URL"} {
			u := env[key].Value
			_, ca, _ := strings.Cut(u, "sslrootcert=")
			if !strings.Contains(u, "sslmode=verify-full") || !mounted[path.Dir(ca)] {
				t.Errorf("%s: %s %q does not verify the server against a mounted CA", name, key, u)
			}
		}
	}
}

func findSTS(r *rendered, name string) *appsv1.StatefulSet {
	for _, s := range r.statefulSets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// TestPrometheusRule: the prod overlay's PrometheusRule carries exactly the
// groups of deploy/alerts/shardstock.rules.yml. UPDATE=1 rewrites it.
func TestPrometheusRule(t *testing.T) {
	src, err := os.ReadFile("../alerts/shardstock.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(src, &rules); err != nil {
		t.Fatal(err)
	}
	want := monitoringv1.PrometheusRule{}
	want.APIVersion, want.Kind, want.Name = "monitoring.coreos.com/v1", "PrometheusRule", "shardstock"
	want.Spec.Groups = rules.Groups
	out, err := yaml.Marshal(&want)
	if err != nil {
		t.Fatal(err)
	}
	out = append([]byte("# Generated from deploy/alerts/shardstock.rules.yml by deploy/k8s's\n# TestPrometheusRule (UPDATE=1 go test ./... in deploy/k8s): do not edit.\n"), out...)
	const path = "overlays/prod/prometheusrule.yaml"
	if os.Getenv("UPDATE") == "1" {
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, out) {
		t.Errorf("%s differs from deploy/alerts/shardstock.rules.yml: run UPDATE=1 go test ./... in deploy/k8s", path)
	}
}

// TestDockerfile: the image's stages are pinned, its binaries static, and
// it runs as a non-root user.
func TestDockerfile(t *testing.T) {
	src, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var froms []string
	user := ""
	for _, line := range strings.Split(string(src), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "FROM" {
			froms = append(froms, f[1])
			if err := pinned(f[1]); err != nil {
				t.Errorf("Dockerfile: %v", err)
			}
		}
		if len(f) >= 2 && f[0] == "USER" {
			user = f[1]
		}
	}
	if len(froms) < 2 {
		t.Errorf("Dockerfile has %d stages, want a build stage and a runtime stage", len(froms))
	}
	if user == "" || strings.HasPrefix(user, "0") || strings.HasPrefix(user, "root") {
		t.Errorf("Dockerfile's last USER is %q, want a non-root user", user)
	}
	if strings.Count(string(src), "CGO_ENABLED=0") < 2 {
		t.Error("Dockerfile does not build both binaries with CGO_ENABLED=0 (static)")
	}
}
