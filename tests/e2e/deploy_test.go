package e2e

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// The deploy/ tests apply the shipped manifests as they are. Their
// ValidatingWebhookConfiguration calls a Service that has no endpoints here
// (no kubelet runs the pods), with failurePolicy Fail, so no test may change
// deploy labels while one is installed: each test removes everything it
// applied before it ends, and the lab tests register their loopback
// configuration again in setUpLab.

const (
	guardNS         = "gpu-deploy-guard"
	guardSA         = "system:serviceaccount:gpu-deploy-guard:gpu-deploy-guard"
	certManagerCRDs = "testdata/cert-manager-crds.yaml"
	watchedCRDs     = "testdata/watched-crds.yaml"
	serviceDNS      = "gpu-deploy-guard.gpu-deploy-guard.svc"
)

// What `kubectl apply -k` prints for the objects of deploy/base, in
// kustomize's output order; an overlay adds its own lines.
var baseApplyLines = []string{
	"namespace/gpu-deploy-guard",
	"serviceaccount/gpu-deploy-guard",
	"role.rbac.authorization.k8s.io/gpu-deploy-guard-events",
	"role.rbac.authorization.k8s.io/gpu-deploy-guard-audit-lease",
	"role.rbac.authorization.k8s.io/gpu-deploy-guard",
	"clusterrole.rbac.authorization.k8s.io/gpu-deploy-guard",
	"rolebinding.rbac.authorization.k8s.io/gpu-deploy-guard-events",
	"rolebinding.rbac.authorization.k8s.io/gpu-deploy-guard-audit-lease",
	"rolebinding.rbac.authorization.k8s.io/gpu-deploy-guard",
	"clusterrolebinding.rbac.authorization.k8s.io/gpu-deploy-guard",
	"configmap/gpu-deploy-guard-config",
	"service/gpu-deploy-guard",
	"service/gpu-deploy-guard-metrics",
	"priorityclass.scheduling.k8s.io/gpu-deploy-guard-critical",
	"deployment.apps/gpu-deploy-guard",
	"poddisruptionbudget.policy/gpu-deploy-guard",
	"networkpolicy.networking.k8s.io/gpu-deploy-guard",
	"validatingwebhookconfiguration.admissionregistration.k8s.io/gpu-deploy-guard",
}

// applyOutput is the exact stdout of `kubectl apply` for these objects.
func applyOutput(objects []string, verb string) string {
	var b strings.Builder
	for _, o := range objects {
		b.WriteString(o + " " + verb + "\n")
	}
	return b.String()
}

// insertAfter returns lines with extra inserted after the line after.
func insertAfter(lines []string, after string, extra ...string) []string {
	var out []string
	for _, l := range lines {
		out = append(out, l)
		if l == after {
			out = append(out, extra...)
		}
	}
	return out
}

// copyDeploy copies deploy/ into a temporary directory, so that generated
// certificates and patches never land in the repository. Files that a
// local static-certs install may have left there (git-ignored) are not
// copied: the test makes its own.
func copyDeploy(t *testing.T) string {
	t.Helper()
	src := filepath.Join(repoRoot(t), "deploy")
	dst := filepath.Join(t.TempDir(), "deploy")
	generated := map[string]bool{"ca.crt": true, "tls.crt": true, "tls.key": true, "cabundle-patch.yaml": true}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if filepath.Dir(rel) == filepath.Join("overlays", "static-certs") && generated[d.Name()] {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, info.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// installKustomization applies dir with `kubectl apply -k`, as a first
// install, and removes it all again (waiting for the namespace to go) when
// the test ends. The GPU
// Operator's namespace must exist first (deploy/README.md); it is created
// here when missing and left in place, as an operator install would be.
func installKustomization(t *testing.T, dir string) result {
	t.Helper()
	cp.MustKubectl(t, "apply", "-f", operandDaemonSet) // namespace gpu-operator (and the lab's DaemonSets)
	// The lab tests' loopback registration has the same name; this is a
	// fresh install, and setUpLab registers the loopback version again.
	cp.MustKubectl(t, "delete", "validatingwebhookconfiguration", framework.WebhookConfigurationName, "--ignore-not-found")
	t.Cleanup(func() {
		if got := kubectl("delete", "-k", dir, "--ignore-not-found", "--wait=true", "--timeout=120s"); got.code != 0 {
			t.Errorf("cleanup: kubectl delete -k %s: %s", dir, got)
		}
	})
	return kubectl("apply", "-k", dir)
}

// expectGet runs `kubectl get ... -o jsonpath=<query>` and compares its output.
func expectGet(t *testing.T, want, query string, object ...string) {
	t.Helper()
	args := append(append([]string{"get"}, object...), "-o", "jsonpath="+query)
	got := kubectl(args...)
	if got.code != 0 || got.stdout != want || got.stderr != "" {
		t.Errorf("kubectl %s:\n%s\nwant stdout %q", strings.Join(args, " "), got, want)
	}
}

// expectGuardPods waits until the Deployment's ReplicaSet has created both
// pods: the namespace enforces Pod Security "restricted" and the pods name
// the shipped PriorityClass, so their creation shows both are satisfied.
// kube-scheduler binds them, but they stay Pending: kwok runs only DaemonSet
// pods (framework/scheduling.go).
func expectGuardPods(t *testing.T) {
	t.Helper()
	cp.WaitForKubectlOutput(t, 60*time.Second, "1000000000 1000000000", "get", "pods", "-n", guardNS,
		"-l", "app.kubernetes.io/name=gpu-deploy-guard,app.kubernetes.io/component=webhook",
		"-o", "jsonpath={.items[*].spec.priority}")
}

// expectCommonObjects checks the objects every overlay gets from deploy/base.
func expectCommonObjects(t *testing.T) {
	t.Helper()
	expectGet(t, "2 gpu-deploy-guard-critical gpu-deploy-guard ghcr.io/gpu-deploy-guard/gpu-deploy-guard:0.1.0 gpu-deploy-guard-tls",
		`{.spec.replicas} {.spec.template.spec.priorityClassName} {.spec.template.spec.serviceAccountName} `+
			`{.spec.template.spec.containers[0].image} {.spec.template.spec.volumes[?(@.name=="tls")].secret.secretName}`,
		"deployment", "gpu-deploy-guard", "-n", guardNS)
	// The webhook Service exposes the webhook port only; /metrics has a
	// Service of its own, and the NetworkPolicy admits the metrics port
	// from the monitoring namespace only.
	expectGet(t, "ClusterIP webhook 443 webhook", `{.spec.type} {.spec.ports[*].name} {.spec.ports[*].port} {.spec.ports[*].targetPort}`,
		"service", "gpu-deploy-guard", "-n", guardNS)
	expectGet(t, "ClusterIP metrics 8080 admin", `{.spec.type} {.spec.ports[*].name} {.spec.ports[*].port} {.spec.ports[*].targetPort}`,
		"service", "gpu-deploy-guard-metrics", "-n", guardNS)
	expectGet(t, "webhook admin monitoring", `{.spec.ingress[0].ports[*].port} {.spec.ingress[1].ports[*].port} `+
		`{.spec.ingress[1].from[0].namespaceSelector.matchLabels.kubernetes\.io/metadata\.name}`,
		"networkpolicy", "gpu-deploy-guard", "-n", guardNS)
	expectGet(t, "1 AlwaysAllow", `{.spec.maxUnavailable} {.spec.unhealthyPodEvictionPolicy}`,
		"poddisruptionbudget", "gpu-deploy-guard", "-n", guardNS)
	expectGet(t, "1000000000 PreemptLowerPriority", `{.value} {.preemptionPolicy}`, "priorityclass", "gpu-deploy-guard-critical")
	expectGet(t, "restricted", `{.metadata.labels.pod-security\.kubernetes\.io/enforce}`, "namespace", guardNS)
	expectGet(t,
		"enforce.gpu-deploy-guard.io Fail UPDATE nodes,nodes/status gpu-deploy-guard/gpu-deploy-guard:443/validate\n"+
			"observe.gpu-deploy-guard.io Ignore CREATE,UPDATE nodes gpu-deploy-guard/gpu-deploy-guard:443/validate\n"+
			"policy.gpu-deploy-guard.io Fail CREATE,UPDATE,DELETE clusterpolicies gpu-deploy-guard/gpu-deploy-guard:443/validate/gpu-policy\n",
		`{range .webhooks[*]}{.name} {.failurePolicy} {.rules[0].operations[0]}{range .rules[0].operations[1:]},{@}{end} `+
			`{.rules[0].resources[0]}{range .rules[0].resources[1:]},{@}{end} `+
			`{.clientConfig.service.namespace}/{.clientConfig.service.name}:{.clientConfig.service.port}{.clientConfig.service.path}{"\n"}{end}`,
		"validatingwebhookconfiguration", framework.WebhookConfigurationName)
	expectGuardPods(t)
}

// TestStaticCertsOverlayInstallsWithCertificatesFromTheBinary follows
// deploy/README.md's static-certs install in a copy of deploy/:
// `gpu-deploy-guard certs` for the Service's names, set-ca-bundle.sh,
// `kubectl apply -k`. Every object must be accepted, the Secret must hold
// the certificate, the webhooks must trust its CA, and a second apply must
// change nothing.
func TestStaticCertsOverlayInstallsWithCertificatesFromTheBinary(t *testing.T) {
	bin := framework.RequireProductBinary(t)
	overlay := filepath.Join(copyDeploy(t), "overlays", "static-certs")

	cmd := exec.Command(bin, "certs", "--out", overlay, "--dns", serviceDNS, "--dns", serviceDNS+".cluster.local")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	printed, err := cmd.Output()
	if err != nil {
		t.Fatalf("gpu-deploy-guard certs: %v\n%s", err, stderr.String())
	}
	caBundle := strings.TrimSpace(string(printed))

	// Without the patch, kustomize refuses, as the README says.
	got := kubectl("kustomize", overlay)
	if got.code != 1 || !strings.Contains(got.stderr, "cabundle-patch.yaml") {
		t.Fatalf("kubectl kustomize before set-ca-bundle.sh: %s\nwant exit 1 naming cabundle-patch.yaml", got)
	}
	script := exec.Command(filepath.Join(overlay, "set-ca-bundle.sh"))
	out, err := script.CombinedOutput()
	want := "wrote " + filepath.Join(overlay, "cabundle-patch.yaml") + " (1 CA certificate(s) from " + filepath.Join(overlay, "ca.crt") + ")\n"
	if err != nil || string(out) != want {
		t.Fatalf("set-ca-bundle.sh: %v\n%s\nwant %q", err, out, want)
	}

	caPEM, err := os.ReadFile(filepath.Join(overlay, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	tlsPEM, err := os.ReadFile(filepath.Join(overlay, "tls.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if base64.StdEncoding.EncodeToString(caPEM) != caBundle {
		t.Fatalf("the caBundle `certs` printed is not base64(ca.crt)")
	}
	verifyServingCert(t, caPEM, tlsPEM, serviceDNS)

	got = installKustomization(t, overlay)
	lines := insertAfter(baseApplyLines, "configmap/gpu-deploy-guard-config", "secret/gpu-deploy-guard-tls")
	expectResult(t, "kubectl apply -k deploy/overlays/static-certs", got, 0, applyOutput(lines, "created"), "")
	expectCommonObjects(t)
	expectGet(t, "kubernetes.io/tls "+base64.StdEncoding.EncodeToString(tlsPEM), `{.type} {.data.tls\.crt}`,
		"secret", "gpu-deploy-guard-tls", "-n", guardNS)
	expectGet(t, caBundle+" "+caBundle, `{.webhooks[*].clientConfig.caBundle}`,
		"validatingwebhookconfiguration", framework.WebhookConfigurationName)

	reapplyChangesNothing(t, overlay, lines)
}

// Two objects are reported "configured" by every client-side `kubectl apply`
// although nothing changes (their resourceVersion stays the same):
//   - the PodDisruptionBudget: spec.selector has patch strategy "replace",
//     so kubectl's computed patch always carries it;
//   - a Secret from kustomize's secretGenerator: kustomize wraps base64 data
//     at 76 characters, the API server returns it unwrapped, and the
//     three-way diff sees a change (kubernetes-sigs/kustomize#4653).
//
// Neither is a fault in deploy/; reapplyChangesNothing pins both.
var reappliedAlways = map[string]bool{
	"poddisruptionbudget.policy/gpu-deploy-guard": true,
	"secret/gpu-deploy-guard-tls":                 true,
}

// reapplyChangesNothing applies dir a second time: every object must be
// unchanged, except the two above, whose resourceVersion must not move.
func reapplyChangesNothing(t *testing.T, dir string, objects []string) {
	t.Helper()
	versions := map[string]string{}
	var want strings.Builder
	for _, o := range objects {
		verb := "unchanged"
		if reappliedAlways[o] {
			verb = "configured"
			versions[o] = cp.MustKubectl(t, "get", o, "-n", guardNS, "-o", "jsonpath={.metadata.resourceVersion}")
		}
		want.WriteString(o + " " + verb + "\n")
	}
	expectResult(t, "kubectl apply -k "+dir+" (again)", kubectl("apply", "-k", dir), 0, want.String(), "")
	for o, rv := range versions {
		if now := cp.MustKubectl(t, "get", o, "-n", guardNS, "-o", "jsonpath={.metadata.resourceVersion}"); now != rv {
			t.Errorf("%s: resourceVersion %s -> %s: the second apply did change it", o, rv, now)
		}
	}
}

// verifyServingCert checks that tls.crt chains to ca.crt and names host.
func verifyServingCert(t *testing.T, caPEM, certPEM []byte, host string) {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no PEM certificate")
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("tls.crt holds no PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("tls.crt does not verify for %s against ca.crt: %v", host, err)
	}
}

// TestCertManagerOverlayInstallsWithStandInCRDs applies the recommended
// overlay. cert-manager itself is not installed: stand-in CRDs let the API
// server accept the Issuers and Certificates, which is what this checks,
// together with the wiring between them (the Certificate's Secret is the
// one the Deployment mounts, the CA injection annotation names that
// Certificate, the serving certificate names the Service).
func TestCertManagerOverlayInstallsWithStandInCRDs(t *testing.T) {
	t.Cleanup(func() {
		if got := kubectl("delete", "-f", certManagerCRDs, "--ignore-not-found", "--wait=true", "--timeout=60s"); got.code != 0 {
			t.Errorf("cleanup: kubectl delete -f %s: %s", certManagerCRDs, got)
		}
	})
	cp.MustKubectl(t, "apply", "-f", certManagerCRDs)
	cp.WaitCRDsServed(t, "issuers.cert-manager.io", "certificates.cert-manager.io")

	overlay := filepath.Join(repoRoot(t), "deploy", "overlays", "cert-manager")
	got := installKustomization(t, overlay)
	lines := append(slicesClone(baseApplyLines[:len(baseApplyLines)-2]),
		"certificate.cert-manager.io/gpu-deploy-guard-ca",
		"certificate.cert-manager.io/gpu-deploy-guard-tls",
		"issuer.cert-manager.io/gpu-deploy-guard-ca",
		"issuer.cert-manager.io/gpu-deploy-guard-selfsigned")
	lines = append(lines, baseApplyLines[len(baseApplyLines)-2:]...)
	expectResult(t, "kubectl apply -k deploy/overlays/cert-manager", got, 0, applyOutput(lines, "created"), "")
	expectCommonObjects(t)

	expectGet(t, "gpu-deploy-guard-tls gpu-deploy-guard-ca Issuer "+serviceDNS+" "+serviceDNS+".cluster.local",
		`{.spec.secretName} {.spec.issuerRef.name} {.spec.issuerRef.kind} {.spec.dnsNames[*]}`,
		"certificate.cert-manager.io", "gpu-deploy-guard-tls", "-n", guardNS)
	expectGet(t, "true gpu-deploy-guard-ca gpu-deploy-guard-selfsigned Never",
		`{.spec.isCA} {.spec.secretName} {.spec.issuerRef.name} {.spec.privateKey.rotationPolicy}`,
		"certificate.cert-manager.io", "gpu-deploy-guard-ca", "-n", guardNS)
	expectGet(t, "gpu-deploy-guard-ca", `{.spec.ca.secretName}`, "issuer.cert-manager.io", "gpu-deploy-guard-ca", "-n", guardNS)
	expectGet(t, "{}", `{.spec.selfSigned}`, "issuer.cert-manager.io", "gpu-deploy-guard-selfsigned", "-n", guardNS)
	// cainjector fills caBundle from this Certificate; until then it is empty.
	expectGet(t, "gpu-deploy-guard/gpu-deploy-guard-tls|", `{.metadata.annotations.cert-manager\.io/inject-ca-from}|{.webhooks[*].clientConfig.caBundle}`,
		"validatingwebhookconfiguration", framework.WebhookConfigurationName)

	reapplyChangesNothing(t, overlay, lines)
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

// TestShippedRBACLetsTheWebhookReadAndReportButNotWrite applies deploy/base
// and asks the API server's authorizer, as the webhook's service account,
// for each permission deploy/README.md lists, and for the ones it must not
// have.
func TestShippedRBACLetsTheWebhookReadAndReportButNotWrite(t *testing.T) {
	t.Cleanup(func() {
		if got := kubectl("delete", "-f", watchedCRDs, "--ignore-not-found", "--wait=true", "--timeout=60s"); got.code != 0 {
			t.Errorf("cleanup: kubectl delete -f %s: %s", watchedCRDs, got)
		}
	})
	cp.MustKubectl(t, "apply", "-f", watchedCRDs)
	cp.WaitCRDsServed(t, "clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com", "gpuclusters.nvidia.com", "clusterpolicyreports.wgpolicyk8s.io")
	got := installKustomization(t, filepath.Join(repoRoot(t), "deploy", "base"))
	expectResult(t, "kubectl apply -k deploy/base", got, 0, applyOutput(baseApplyLines, "created"), "")

	cases := []struct {
		verb, resource, scope string // scope: -A for cluster-wide, else -n <namespace>
		allowed               bool
	}{
		{"get", "nodes", "-A", true},
		{"list", "nodes", "-A", true},
		{"watch", "nodes", "-A", true},
		{"get", "clusterpolicies.nvidia.com", "-A", true},
		{"list", "clusterpolicies.nvidia.com", "-A", true},
		{"watch", "clusterpolicies.nvidia.com", "-A", true},
		{"get", "nvidiadrivers.nvidia.com", "-A", true},
		{"list", "nvidiadrivers.nvidia.com", "-A", true},
		{"watch", "nvidiadrivers.nvidia.com", "-A", true},
		{"get", "gpuclusters.nvidia.com", "-A", true},
		{"list", "gpuclusters.nvidia.com", "-A", true},
		{"watch", "gpuclusters.nvidia.com", "-A", true},
		{"list", "resourceslices.resource.k8s.io", "-A", true},
		{"watch", "resourceslices.resource.k8s.io", "-A", true},
		{"create", "clusterpolicyreports.wgpolicyk8s.io", "-A", true},
		{"patch", "clusterpolicyreports.wgpolicyk8s.io", "-A", true},
		{"get", "daemonsets.apps", "gpu-operator", true},
		{"list", "daemonsets.apps", "gpu-operator", true},
		{"watch", "daemonsets.apps", "gpu-operator", true},
		{"get", "deployments.apps", "gpu-operator", true},
		{"list", "deployments.apps", "gpu-operator", true},
		{"watch", "deployments.apps", "gpu-operator", true},
		{"get", "pods", "gpu-operator", true},
		{"list", "pods", "gpu-operator", true},
		{"watch", "pods", "gpu-operator", true},
		// The audit's Lease (serve --audit-lease): that one Lease, in the guard's namespace.
		{"create", "leases.coordination.k8s.io", guardNS, true},
		{"get", "leases.coordination.k8s.io/gpu-deploy-guard-audit", guardNS, true},
		{"update", "leases.coordination.k8s.io/gpu-deploy-guard-audit", guardNS, true},
		{"patch", "leases.coordination.k8s.io/gpu-deploy-guard-audit", guardNS, true},

		// Events on the Nodes: created in default, never read, changed or deleted.
		{"create", "events.events.k8s.io", "default", true},
		{"patch", "events.events.k8s.io", "default", false},
		{"list", "events.events.k8s.io", "default", false},
		{"delete", "events.events.k8s.io", "default", false},
		{"create", "events.events.k8s.io", guardNS, false},
		{"create", "events", "default", false},

		{"patch", "leases.coordination.k8s.io/other", guardNS, false},
		{"get", "leases.coordination.k8s.io/other", guardNS, false},
		{"create", "leases.coordination.k8s.io", "kube-system", false},
		{"delete", "leases.coordination.k8s.io/gpu-deploy-guard-audit", guardNS, false},
		{"patch", "nodes", "-A", false},
		{"update", "nodes", "-A", false},
		{"delete", "nodes", "-A", false},
		{"patch", "nodes/status", "-A", false},
		{"get", "secrets", guardNS, false},
		{"get", "secrets", "gpu-operator", false},
		{"list", "secrets", "-A", false},
		{"list", "pods", "default", false},
		{"list", "pods", guardNS, false},
		{"list", "pods", "-A", false},
		{"delete", "pods", "gpu-operator", false},
		{"list", "daemonsets.apps", "kube-system", true},
		{"watch", "daemonsets.apps", "-A", true},
		{"get", "daemonsets.apps", "kube-system", false},
		{"patch", "daemonsets.apps", "gpu-operator", false},
		{"list", "deployments.apps", "kube-system", false},
		{"patch", "deployments.apps", "gpu-operator", false},
		{"patch", "clusterpolicies.nvidia.com", "-A", false},
		{"patch", "nvidiadrivers.nvidia.com", "-A", false},
		{"patch", "gpuclusters.nvidia.com", "-A", false},
		{"create", "resourceslices.resource.k8s.io", "-A", false},
		{"delete", "resourceslices.resource.k8s.io", "-A", false},
		{"list", "clusterpolicyreports.wgpolicyk8s.io", "-A", false},
		{"delete", "clusterpolicyreports.wgpolicyk8s.io", "-A", false},
	}
	for _, c := range cases {
		scope := []string{"-A"}
		if c.scope != "-A" {
			scope = []string{"-n", c.scope}
		}
		args := append([]string{"auth", "can-i", c.verb, c.resource, "--as=" + guardSA}, scope...)
		if c.allowed {
			// The authorizer learns new bindings through an informer: wait
			// for a yes. A no is checked once, after the yeses have come.
			cp.WaitForKubectlOutput(t, 30*time.Second, "yes", args...)
			continue
		}
		if got := kubectl(args...); got != (result{"no\n", "", 1}) {
			t.Errorf("kubectl %s:\n%s\nwant \"no\", exit 1", strings.Join(args, " "), got)
		}
	}
}
