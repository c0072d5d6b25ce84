package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"gpu-deploy-guard/tests/e2e/framework"
)

// The Helm chart (deploy/helm/gpu-deploy-guard), installed with the real
// helm (built from the Go module proxy by tests/helm/build-helm.sh) into
// the suite's control plane.
//
// The webhook runs as a local process, not as a pod: no kubelet, no
// kube-proxy. Two things bridge that, and nothing else differs from a real
// install:
//
//   - helm runs with a post-renderer (cmd/helm-loopback) that rewrites only
//     the ValidatingWebhookConfiguration's clientConfig to the local
//     process's URL and CA, as the rest of the suite does for deploy/base.
//   - helmGuard plays the kubelet for the chart's Deployment: it runs the
//     pod template of the Deployment's newest ReplicaSet, with config.yaml
//     read from the ConfigMap that template mounts. When `helm upgrade`
//     changes the pod template, the real Deployment controller creates a
//     new ReplicaSet (in a cluster: new pods), and helmGuard replaces its
//     process, as the kubelet would start the new pod. It never restarts
//     for anything else, so a change that does not reach the pod template
//     would not reach the process either: that is what the tests prove.

const (
	helmRelease   = "gpu-deploy-guard"
	helmNamespace = "gpu-deploy-guard"
	checksumKey   = "checksum/config"
	// helm template talks to no cluster: the chart's kubeVersion check needs
	// the version the suite runs.
	helmKubeVersion = "1.34.12"
)

var (
	helmOnce                sync.Once
	helmPath, helmRenderer  string
	helmBuildErr            error
	helmChartDir, helmHomes string
)

// helmTools builds (or reuses) helm and the post-renderer.
func helmTools(t *testing.T) {
	t.Helper()
	helmOnce.Do(func() {
		root, err := framework.RepoRoot()
		if err != nil {
			helmBuildErr = err
			return
		}
		helmChartDir = filepath.Join(root, "deploy", "helm", "gpu-deploy-guard")
		helmHomes = filepath.Join(cp.Dir, "helm-home")
		if helmPath = os.Getenv("HELM"); helmPath == "" {
			cmd := exec.Command("bash", filepath.Join(root, "tests", "helm", "build-helm.sh"))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				helmBuildErr = err
				helmPath = stderr.String()
				return
			}
			helmPath = strings.TrimPrefix(strings.TrimSpace(string(out)), "HELM=")
		}
		helmRenderer = filepath.Join(cp.Dir, "helm-loopback")
		build := exec.Command("go", "build", "-o", helmRenderer, "./cmd/helm-loopback")
		build.Env = append(os.Environ(), "GOFLAGS=-mod=readonly -buildvcs=false")
		if out, err := build.CombinedOutput(); err != nil {
			helmBuildErr = err
			helmRenderer = string(out)
		}
	})
	if helmBuildErr != nil {
		t.Fatalf("building helm or cmd/helm-loopback: %v\n%s%s", helmBuildErr, helmPath, helmRenderer)
	}
}

// runHelm runs helm against the control plane as the admin, with its own
// config, cache and data directories.
func runHelm(t *testing.T, args ...string) result {
	t.Helper()
	helmTools(t)
	cmd := exec.Command(helmPath, append([]string{"--kubeconfig", cp.KubeconfigPath}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=",
		"HELM_CONFIG_HOME="+filepath.Join(helmHomes, "config"),
		"HELM_CACHE_HOME="+filepath.Join(helmHomes, "cache"),
		"HELM_DATA_HOME="+filepath.Join(helmHomes, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return result{stdout.String(), stderr.String(), code}
}

// helmGuard is the local process standing in for the chart's pods.
type helmGuard struct {
	g          *framework.Guard
	configFile string
	// podTemplate is the pod-template-hash of the ReplicaSet whose pods the
	// process stands for; starts counts the processes started.
	podTemplate string
	starts      int
}

// startHelmGuard starts the process with the config the chart renders for
// these values (helm template), before the install: helm's post-renderer
// needs the process's URL and CA. sync checks it against the cluster.
func startHelmGuard(t *testing.T, values ...string) *helmGuard {
	t.Helper()
	bin := framework.RequireProductBinary(t)
	got := runHelm(t, append([]string{"template", helmRelease, helmChartDir, "--namespace", helmNamespace,
		"--kube-version", helmKubeVersion, "--show-only", "templates/configmap.yaml"}, values...)...)
	if got.code != 0 {
		t.Fatalf("helm template: %s", got)
	}
	config := configMapConfig(t, got.stdout)
	dir, err := os.MkdirTemp(cp.Dir, "gpu-deploy-guard-helm-")
	if err != nil {
		t.Fatal(err)
	}
	h := &helmGuard{configFile: filepath.Join(dir, "config.yaml")}
	if err := os.WriteFile(h.configFile, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	g, err := framework.StartGuard(framework.GuardConfig{Bin: bin, Dir: dir, LogDir: cp.LogDir,
		ConfigFile: h.configFile, Name: filepath.Base(dir), ExtraArgs: []string{"--no-cluster-watch"}})
	if g != nil {
		t.Cleanup(g.Stop)
	}
	if err != nil {
		t.Fatalf("starting gpu-deploy-guard serve for the chart: %v", err)
	}
	h.g, h.starts = g, 1
	return h
}

func configMapConfig(t *testing.T, manifest string) string {
	t.Helper()
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(manifest), &cm); err != nil {
		t.Fatalf("ConfigMap %q: %v", manifest, err)
	}
	cfg, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatalf("the chart's ConfigMap has no config.yaml:\n%s", manifest)
	}
	return cfg
}

// helmInstall runs `helm install` or `helm upgrade` of the release with the
// post-renderer pointing the webhooks at h, then syncs h to the rollout and
// waits until the API server consults h.
func helmInstall(t *testing.T, h *helmGuard, verb string, values ...string) {
	t.Helper()
	args := []string{verb, helmRelease, helmChartDir, "--namespace", helmNamespace,
		"--post-renderer", helmRenderer,
		"--post-renderer-args", "-url=" + h.g.URL(),
		"--post-renderer-args", "-ca-file=" + filepath.Join(h.g.Dir, "certs", "ca.crt")}
	if verb == "install" {
		args = append(args, "--create-namespace")
	}
	got := runHelm(t, append(args, values...)...)
	if got.code != 0 {
		t.Fatalf("helm %s: %s", verb, got)
	}
	t.Logf("helm %s %s: exit 0", verb, strings.Join(values, " "))
	h.sync(t)
	if err := cp.WaitGuardConsulted(h.g); err != nil {
		t.Fatal(err)
	}
}

// replicaSet is what sync reads of the Deployment's ReplicaSets.
type replicaSet struct {
	Metadata struct {
		Annotations map[string]string `json:"annotations"`
		Labels      map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Template struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec struct {
				Volumes []struct {
					Name      string `json:"name"`
					ConfigMap *struct {
						Name string `json:"name"`
					} `json:"configMap"`
				} `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
	Status struct {
		Replicas int `json:"replicas"`
	} `json:"status"`
}

// sync does the kubelet's part for the newest ReplicaSet of the chart's
// Deployment, once the Deployment controller has acted on the current spec
// and that ReplicaSet has created pods. It checks that checksum/config is
// the SHA-256 of the ConfigMap's config.yaml, writes that file, and runs a
// new process if the pod template is new. It returns the ReplicaSet's
// revision.
func (h *helmGuard) sync(t *testing.T) int {
	t.Helper()
	var newest replicaSet
	revision := 0
	framework.WaitFor(t, 60*time.Second, "the Deployment's newest ReplicaSet to create its pods", func() (bool, string) {
		out, stderr, code := cp.Kubectl("get", "deployment", helmRelease, "-n", helmNamespace,
			"-o", "jsonpath={.metadata.generation} {.status.observedGeneration}")
		if f := strings.Fields(out); code != 0 || len(f) != 2 || f[0] != f[1] {
			return false, "deployment generation/observedGeneration: " + out + stderr
		}
		out, stderr, code = cp.Kubectl("get", "replicasets", "-n", helmNamespace,
			"-l", "app.kubernetes.io/name=gpu-deploy-guard,app.kubernetes.io/component=webhook", "-o", "json")
		if code != 0 {
			return false, stderr
		}
		var list struct {
			Items []replicaSet `json:"items"`
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			return false, err.Error()
		}
		revision = 0
		for _, rs := range list.Items {
			if r, _ := strconv.Atoi(rs.Metadata.Annotations["deployment.kubernetes.io/revision"]); r > revision {
				revision, newest = r, rs
			}
		}
		return revision > 0 && newest.Status.Replicas > 0, "newest ReplicaSet revision " + strconv.Itoa(revision) +
			", pods " + strconv.Itoa(newest.Status.Replicas)
	})
	configMap := ""
	for _, v := range newest.Spec.Template.Spec.Volumes {
		if v.Name == "config" && v.ConfigMap != nil {
			configMap = v.ConfigMap.Name
		}
	}
	if configMap == "" {
		t.Fatalf("the pod template mounts no ConfigMap as volume config")
	}
	config := cp.MustKubectl(t, "get", "configmap", configMap, "-n", helmNamespace, "-o", `jsonpath={.data.config\.yaml}`)
	sum := sha256.Sum256([]byte(config))
	if want := newest.Spec.Template.Metadata.Annotations[checksumKey]; want != hex.EncodeToString(sum[:]) {
		t.Fatalf("pod template %s=%q, but ConfigMap %s holds config.yaml with SHA-256 %x:\n%s", checksumKey, want, configMap, sum, config)
	}
	hash := newest.Metadata.Labels["pod-template-hash"]
	if hash == h.podTemplate {
		return revision
	}
	if h.podTemplate != "" || h.starts > 1 {
		// A new pod template: the new pod starts with the mounted file.
		h.g.Stop()
		if err := os.WriteFile(h.configFile, []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := h.g.Start(); err != nil {
			t.Fatalf("starting the process for ReplicaSet revision %d: %v", revision, err)
		}
		h.starts++
	} else if running, err := os.ReadFile(h.configFile); err != nil || string(running) != config {
		t.Fatalf("the process started before the install runs config:\n%s\nbut the installed ConfigMap holds:\n%s", running, config)
	}
	h.podTemplate = hash
	return revision
}

// helmUninstall removes the release and the namespace helm created.
func helmUninstall(t *testing.T) {
	t.Helper()
	if got := runHelm(t, "uninstall", helmRelease, "--namespace", helmNamespace, "--wait", "--timeout", "60s"); got.code != 0 &&
		!strings.Contains(got.stderr, "not found") {
		t.Errorf("helm uninstall: %s", got)
	}
	if got := kubectl("delete", "namespace", helmNamespace, "--ignore-not-found", "--wait=true", "--timeout=120s"); got.code != 0 {
		t.Errorf("cleanup: kubectl delete namespace %s: %s", helmNamespace, got)
	}
}

// freshHelmInstall clears what the shared webhook registered (same name as
// the chart's configuration: helm refuses to adopt it), resets the lab and
// installs the chart with values.
func freshHelmInstall(t *testing.T, values ...string) *helmGuard {
	t.Helper()
	helmTools(t)
	resetLab(t)
	cp.MustKubectl(t, "delete", "validatingwebhookconfiguration", framework.WebhookConfigurationName, "--ignore-not-found")
	t.Cleanup(func() { helmUninstall(t) })
	h := startHelmGuard(t, values...)
	helmInstall(t, h, "install", values...)
	return h
}

// TestHelmInstallWithDefaultsPassesTheLabChecks: `helm install` with the
// chart's default values, then the lab's kubectl checks: the refusal (and
// its dry run), an allowed change, warnings on an allowed change, the
// operator's service account, and node registration.
func TestHelmInstallWithDefaultsPassesTheLabChecks(t *testing.T) {
	h := freshHelmInstall(t)
	g := h.g

	denied := reviews(t, g, "denied", "UPDATE")
	expectResult(t, "kubectl label node lab-node-2 device-plugin=true",
		kubectl("label", "node", "lab-node-2", deployPrefix+"device-plugin=true"), 1, "", labNode2Refusal)
	expectResult(t, "kubectl label node lab-node-2 device-plugin=true --dry-run=server",
		kubectl("label", "node", "lab-node-2", deployPrefix+"device-plugin=true", "--dry-run=server"), 1, "", labNode2Refusal)
	if now := reviews(t, g, "denied", "UPDATE"); now != denied+2 {
		t.Errorf("denied UPDATE reviews of the chart's webhook went from %v to %v, want +2", denied, now)
	}
	expectResult(t, "kubectl label node lab-node-1 dcgm-exporter=false --overwrite",
		kubectl("label", "node", "lab-node-1", deployPrefix+"dcgm-exporter=false", "--overwrite"), 0, "node/lab-node-1 labeled\n", "")
	expectResult(t, "kubectl label node lab-node-0 device-plugin=false container-toolkit=false --overwrite",
		kubectl("label", "node", "lab-node-0", deployPrefix+"device-plugin=false", deployPrefix+"container-toolkit=false", "--overwrite"), 0,
		"node/lab-node-0 labeled\n",
		"Warning: lab-node-0: gpu-feature-discovery, dcgm-exporter would hang without container-toolkit\n")

	exempt := reviews(t, g, "exempt", "UPDATE")
	expectResult(t, "kubectl label node lab-node-2 device-plugin=true --as="+operatorSA,
		kubectlAsOperator("label", "node", "lab-node-2", deployPrefix+"device-plugin=true"), 0, "node/lab-node-2 labeled\n", "")
	if now := reviews(t, g, "exempt", "UPDATE"); now != exempt+1 {
		t.Errorf("exempt UPDATE reviews went from %v to %v, want +1", exempt, now)
	}

	const node = "apiVersion: v1\nkind: Node\nmetadata:\n  name: lab-node-3\n  labels:\n" +
		"    nvidia.com/gpu.deploy.device-plugin: \"true\"\n"
	t.Cleanup(func() { deleteNode(t, "lab-node-3") })
	stdout, stderr, code := cp.KubectlWithInput(node, "create", "-f", "-")
	expectResult(t, "kubectl create node lab-node-3 (device-plugin=true)", result{stdout, stderr, code}, 0,
		"node/lab-node-3 created\n",
		"Warning: lab-node-3: device-plugin would run without container-toolkit; GPU pods would fail to start\n"+
			"Warning: lab-node-3: device-plugin runs on a node with no NVIDIA GPU label\n")
}

// TestHelmUpgradeWithChangedRulesRollsThePods: `helm upgrade` with a rule
// turned from deny to warn changes the ConfigMap and, through its checksum,
// the pod template; the Deployment controller starts a new ReplicaSet, and
// its pods decide with the new rule. An upgrade with the same values leaves
// the pod template (and the pods) alone. No `kubectl rollout restart`.
func TestHelmUpgradeWithChangedRulesRollsThePods(t *testing.T) {
	h := freshHelmInstall(t)
	if rev := h.sync(t); rev != 1 {
		t.Fatalf("after the install the newest ReplicaSet is revision %d, want 1", rev)
	}
	expectResult(t, "before the upgrade: kubectl label node lab-node-2 device-plugin=true --dry-run=server",
		kubectl("label", "node", "lab-node-2", deployPrefix+"device-plugin=true", "--dry-run=server"), 1, "", labNode2Refusal)

	warn := "--set=config.rules.device-plugin-without-toolkit=warn"
	helmInstall(t, h, "upgrade", warn)
	if rev := h.sync(t); rev != 2 || h.starts != 2 {
		t.Fatalf("after helm upgrade %s: newest ReplicaSet revision %d, processes started %d; want 2 and 2", warn, rev, h.starts)
	}
	expectResult(t, "after the upgrade: kubectl label node lab-node-2 device-plugin=true --dry-run=server",
		kubectl("label", "node", "lab-node-2", deployPrefix+"device-plugin=true", "--dry-run=server"), 0,
		"node/lab-node-2 labeled (server dry run)\n",
		"Warning: lab-node-2: device-plugin would run without container-toolkit; GPU pods would fail to start\n"+
			"Warning: lab-node-2: device-plugin runs on a node with no NVIDIA GPU label\n")

	// The same values again: a new Helm revision, no new pod template.
	helmInstall(t, h, "upgrade", warn)
	if rev := h.sync(t); rev != 2 || h.starts != 2 {
		t.Fatalf("after a second identical upgrade: newest ReplicaSet revision %d, processes started %d; want 2 and 2", rev, h.starts)
	}
	if n := strings.Count(runHelm(t, "history", helmRelease, "-n", helmNamespace, "-o", "json").stdout, `"revision":`); n != 3 {
		t.Errorf("helm history shows %d revisions, want 3 (install and two upgrades)", n)
	}
	expectSelfSignedRotation(t)
}

// expectSelfSignedRotation checks the chart's self-signed certificates on
// the installed release: the upgrades above kept the Secret the install
// generated, and the chart, rendered against the cluster (helm template
// --dry-run=server, which runs its lookup), puts that CA in the caBundle;
// with certificates.selfSigned.regenerate=true it renders a new CA and
// certificate and a caBundle trusting the old CA and the new one, so the
// replicas still serving the old certificate stay trusted during the
// rotation. (The post-renderer replaces the caBundle of what is installed
// here, so the chart's own caBundle is read from the rendering.)
func expectSelfSignedRotation(t *testing.T) {
	t.Helper()
	secret := func(key string) string {
		return cp.MustKubectl(t, "get", "secret", helmRelease+"-tls", "-n", helmNamespace, "-o", "jsonpath={.data."+strings.ReplaceAll(key, ".", `\.`)+"}")
	}
	installedCA, installedCert := secret("ca.crt"), secret("tls.crt")
	first := runHelm(t, "get", "manifest", helmRelease, "-n", helmNamespace, "--revision", "1")
	if first.code != 0 {
		t.Fatalf("helm get manifest --revision 1: %s", first)
	}
	if !strings.Contains(first.stdout, "tls.crt: "+installedCert) || !strings.Contains(first.stdout, "ca.crt: "+installedCA) {
		t.Fatalf("the Secret after two upgrades is not the one the install generated")
	}
	render := func(values ...string) (caBundle []byte, ca, cert string) {
		t.Helper()
		got := runHelm(t, append([]string{"template", helmRelease, helmChartDir, "--namespace", helmNamespace, "--dry-run=server", "--kube-version", helmKubeVersion,
			"--set=config.rules.device-plugin-without-toolkit=warn"}, values...)...)
		if got.code != 0 {
			t.Fatalf("helm template --dry-run=server %v: %s", values, got)
		}
		objs, err := framework.SplitManifests([]byte(got.stdout))
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			Data map[string]string `json:"data"`
		}
		var v struct {
			Webhooks []struct {
				ClientConfig struct {
					CABundle []byte `json:"caBundle"`
				} `json:"clientConfig"`
			} `json:"webhooks"`
		}
		for _, o := range objs {
			switch o.Kind {
			case "Secret":
				err = yaml.Unmarshal(o.YAML, &s)
			case "ValidatingWebhookConfiguration":
				err = yaml.Unmarshal(o.YAML, &v)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if len(v.Webhooks) != 3 || !bytes.Equal(v.Webhooks[0].ClientConfig.CABundle, v.Webhooks[1].ClientConfig.CABundle) ||
			!bytes.Equal(v.Webhooks[0].ClientConfig.CABundle, v.Webhooks[2].ClientConfig.CABundle) {
			t.Fatalf("want three webhooks with one caBundle, got %d", len(v.Webhooks))
		}
		return v.Webhooks[0].ClientConfig.CABundle, s.Data["ca.crt"], s.Data["tls.crt"]
	}
	pemOf := func(b64 string) string {
		b, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	bundle, ca, cert := render()
	if ca != installedCA || cert != installedCert || string(bundle) != pemOf(installedCA) {
		t.Errorf("an upgrade would not keep the installed CA and certificate, or its caBundle is not that CA")
	}
	bundle, ca, cert = render("--set=certificates.selfSigned.regenerate=true")
	if ca == installedCA || cert == installedCert {
		t.Fatalf("regenerate=true renders the installed CA or certificate again")
	}
	if string(bundle) != pemOf(installedCA)+pemOf(ca) || strings.Count(string(bundle), "BEGIN CERTIFICATE") != 2 {
		t.Errorf("regenerate=true: caBundle is not the installed CA followed by the new one:\n%s", bundle)
	}
	verifyServingCert(t, []byte(pemOf(ca)), []byte(pemOf(cert)), helmRelease+"."+helmNamespace+".svc")
}

// dryRunLabNode2 is the lab's bad change as a server-side dry run.
func dryRunLabNode2() result {
	return kubectl("label", "node", "lab-node-2", deployPrefix+"device-plugin=true", "--dry-run=server")
}

// waitKubectl polls a kubectl call until it gives want: the API server
// picks up a changed webhook configuration through an informer.
func waitKubectl(t *testing.T, what string, want result, call func() result) {
	t.Helper()
	var last result
	framework.WaitFor(t, 30*time.Second, what, func() (bool, string) {
		last = call()
		return last == want, last.String()
	})
	t.Logf("%s:\n%s", what, last)
}

// TestHelmEnforcementStagesChangeWhatKubectlShows walks the staged rollout
// audit -> warn -> enforce with `helm upgrade --set enforcement=...`, and in
// each stage also stops the webhook process (every pod down) to show what
// the failure policy of that stage does.
func TestHelmEnforcementStagesChangeWhatKubectlShows(t *testing.T) {
	h := freshHelmInstall(t, "--set=enforcement=audit")
	down := func(stage string, want result) {
		t.Helper()
		h.g.Stop()
		waitKubectl(t, stage+", webhook down: kubectl label node lab-node-2 device-plugin=true --dry-run=server", want, dryRunLabNode2)
		if err := h.g.Start(); err != nil {
			t.Fatal(err)
		}
	}
	allowed := result{"node/lab-node-2 labeled (server dry run)\n", "", 0}

	audited := reviews(t, h.g, "", "UPDATE")
	expectResult(t, "audit: kubectl label node lab-node-2 device-plugin=true --dry-run=server", dryRunLabNode2(),
		allowed.code, allowed.stdout, allowed.stderr)
	if now := reviews(t, h.g, "", "UPDATE"); now != audited+1 {
		t.Errorf("audit: UPDATE reviews went from %v to %v, want +1 (decided and recorded, not shown)", audited, now)
	}
	down("audit", allowed)

	helmInstall(t, h, "upgrade", "--set=enforcement=warn")
	waitKubectl(t, "warn: kubectl label node lab-node-2 device-plugin=true --dry-run=server",
		result{allowed.stdout,
			"Warning: lab-node-2: device-plugin would run without container-toolkit; GPU pods would fail to start\n" +
				"Warning: lab-node-2: device-plugin runs on a node with no NVIDIA GPU label\n", 0}, dryRunLabNode2)
	down("warn", allowed)

	helmInstall(t, h, "upgrade", "--set=enforcement=enforce")
	waitKubectl(t, "enforce: kubectl label node lab-node-2 device-plugin=true --dry-run=server",
		result{"", labNode2Refusal, 1}, dryRunLabNode2)
	h.g.Stop()
	framework.WaitFor(t, 30*time.Second, "enforce, webhook down: the change to be refused for failing to call the webhook", func() (bool, string) {
		got := dryRunLabNode2()
		return got.code == 1 && strings.Contains(got.stderr, `failed calling webhook "enforce.gpu-deploy-guard.io"`), got.String()
	})
	if err := h.g.Start(); err != nil {
		t.Fatal(err)
	}
}

// TestHelmOperatorNamespaceLetsThatNamespacesServiceAccountsThrough:
// operatorNamespace=nvidia-gpu-operator (OpenShift's namespace) moves the
// exemption in the matchConditions and the config, and the Role, to that
// namespace: its service account's change passes (exempt, through the
// observe webhook), and the default namespace's is refused.
func TestHelmOperatorNamespaceLetsThatNamespacesServiceAccountsThrough(t *testing.T) {
	const ns = "nvidia-gpu-operator"
	const sa = "system:serviceaccount:" + ns + ":gpu-operator"
	rbac := "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + ns + "\n---\n" +
		"apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: gpu-operator\n  namespace: " + ns + "\n---\n" +
		"apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: " + ns + "-node-labels\n" +
		"roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: gpu-operator-node-labels\n" +
		"subjects:\n- kind: ServiceAccount\n  name: gpu-operator\n  namespace: " + ns + "\n"
	resetLab(t) // the ClusterRole gpu-operator-node-labels
	if stdout, stderr, code := cp.KubectlWithInput(rbac, "apply", "-f", "-"); code != 0 {
		t.Fatalf("kubectl apply: %s%s", stdout, stderr)
	}
	t.Cleanup(func() {
		if stdout, stderr, code := cp.KubectlWithInput(rbac, "delete", "-f", "-", "--ignore-not-found", "--wait=true"); code != 0 {
			t.Errorf("cleanup: %s%s", stdout, stderr)
		}
	})
	h := freshHelmInstall(t, "--set=operatorNamespace="+ns)

	expectGet(t, ns, `{.metadata.namespace}`, "role", helmRelease, "-n", ns)
	exempt := reviews(t, h.g, "exempt", "UPDATE")
	expectResult(t, "kubectl label node lab-node-2 device-plugin=true --dry-run=server --as="+sa,
		kubectl("--as="+sa, "label", "node", "lab-node-2", deployPrefix+"device-plugin=true", "--dry-run=server"), 0,
		"node/lab-node-2 labeled (server dry run)\n", "")
	if now := reviews(t, h.g, "exempt", "UPDATE"); now != exempt+1 {
		t.Errorf("exempt UPDATE reviews went from %v to %v, want +1", exempt, now)
	}
	expectResult(t, "kubectl label node lab-node-2 device-plugin=true --dry-run=server --as="+operatorSA,
		kubectlAsOperator("label", "node", "lab-node-2", deployPrefix+"device-plugin=true", "--dry-run=server"), 1, "", labNode2Refusal)
}

// TestHelmUninstallLeavesNoWebhookConfiguration: after `helm uninstall`
// nothing of the chart's admission configuration is left, and the change
// the webhook refused goes through.
func TestHelmUninstallLeavesNoWebhookConfiguration(t *testing.T) {
	freshHelmInstall(t)
	expectResult(t, "helm uninstall", runHelm(t, "uninstall", helmRelease, "--namespace", helmNamespace, "--wait"), 0,
		"release \""+helmRelease+"\" uninstalled\n", "")
	expectResult(t, "kubectl get validatingwebhookconfigurations,validatingadmissionpolicies -o name",
		kubectl("get", "validatingwebhookconfigurations,validatingadmissionpolicies,validatingadmissionpolicybindings", "-o", "name"), 0, "", "")
	// The API server drops a deleted webhook configuration from its informer
	// soon, not at once.
	waitKubectl(t, "after uninstall: kubectl label node lab-node-2 device-plugin=true --dry-run=server",
		result{"node/lab-node-2 labeled (server dry run)\n", "", 0}, dryRunLabNode2)
}

// TestHelmInstallWhosePodsNeverBecomeReadyIsRolledBack: the documented
// install (`--wait --atomic`) of a release whose pods never become ready
// (here nothing runs them) fails, and the rollback removes the webhook
// configuration with everything else, so people's deploy-label changes are
// not left refused.
func TestHelmInstallWhosePodsNeverBecomeReadyIsRolledBack(t *testing.T) {
	helmTools(t)
	resetLab(t)
	cp.MustKubectl(t, "delete", "validatingwebhookconfiguration", framework.WebhookConfigurationName, "--ignore-not-found")
	t.Cleanup(func() { helmUninstall(t) })
	got := runHelm(t, "install", helmRelease, helmChartDir, "--namespace", helmNamespace, "--create-namespace",
		"--wait", "--atomic", "--timeout", "10s")
	if got.code != 1 || !strings.Contains(got.stderr, "uninstalled due to atomic being set") {
		t.Fatalf("helm install --wait --atomic with pods that never become ready: %s\nwant exit 1, rolled back", got)
	}
	expectResult(t, "kubectl get validatingwebhookconfigurations -o name", kubectl("get", "validatingwebhookconfigurations", "-o", "name"), 0,
		"", "")
	waitKubectl(t, "after the failed install: kubectl label node lab-node-2 device-plugin=true --dry-run=server",
		result{"node/lab-node-2 labeled (server dry run)\n", "", 0}, dryRunLabNode2)
}
