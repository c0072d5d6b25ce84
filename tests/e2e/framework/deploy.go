package framework

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// WebhookConfigurationName is the ValidatingWebhookConfiguration deploy/base ships.
const WebhookConfigurationName = "gpu-deploy-guard"

// RepoRoot returns the repository root (the directory with Cargo.toml and
// deploy/): found from this source file's location, else upwards from the
// working directory.
func RepoRoot() (string, error) {
	isRoot := func(dir string) bool {
		_, errCargo := os.Stat(filepath.Join(dir, "Cargo.toml"))
		st, errDeploy := os.Stat(filepath.Join(dir, "deploy"))
		return errCargo == nil && errDeploy == nil && st.IsDir()
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		if dir := filepath.Join(filepath.Dir(file), "..", "..", ".."); isRoot(dir) {
			return filepath.Clean(dir), nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for !isRoot(dir) {
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the repository root (Cargo.toml and deploy/) above the working directory")
		}
		dir = parent
	}
	return dir, nil
}

// Object is one rendered manifest: its kind and name, and the YAML itself.
type Object struct {
	APIVersion, Kind, Namespace, Name string
	YAML                              []byte
}

// Kustomize renders a kustomization directory with `kubectl kustomize` (the
// kustomize built into the kubectl under test) and splits the documents.
func (cp *ControlPlane) Kustomize(dir string) ([]Object, error) {
	stdout, stderr, code := cp.Kubectl("kustomize", dir)
	if code != 0 {
		return nil, fmt.Errorf("kubectl kustomize %s: exit %d: %s", dir, code, strings.TrimSpace(stderr))
	}
	return SplitManifests([]byte(stdout))
}

// SplitManifests splits a multi-document YAML stream into objects.
func SplitManifests(data []byte) ([]Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []Object
	for {
		doc, err := r.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, fmt.Errorf("manifest %q...: %w", firstLine(doc), err)
		}
		if head.Kind == "" && head.APIVersion == "" {
			continue // only comments
		}
		out = append(out, Object{APIVersion: head.APIVersion, Kind: head.Kind, Namespace: head.Metadata.Namespace,
			Name: head.Metadata.Name, YAML: doc})
	}
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(bytes.TrimSpace(b), []byte("\n"))
	return string(line)
}

// Find returns the one object of this kind and name.
func Find(objs []Object, kind, name string) (Object, error) {
	var found []Object
	for _, o := range objs {
		if o.Kind == kind && o.Name == name {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		return Object{}, fmt.Errorf("want exactly one %s %q in the rendered manifests, found %d", kind, name, len(found))
	}
	return found[0], nil
}

// ShippedWebhookConfiguration is deploy/base's ValidatingWebhookConfiguration,
// as `kubectl kustomize deploy/base` renders it.
func (cp *ControlPlane) ShippedWebhookConfiguration(repoRoot string) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	objs, err := cp.Kustomize(filepath.Join(repoRoot, "deploy", "base"))
	if err != nil {
		return nil, err
	}
	o, err := Find(objs, "ValidatingWebhookConfiguration", WebhookConfigurationName)
	if err != nil {
		return nil, err
	}
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(o.YAML, &vwc); err != nil {
		return nil, fmt.Errorf("deploy/base ValidatingWebhookConfiguration: %w", err)
	}
	return &vwc, nil
}

// ShippedGuardConfig is config.yaml from deploy/base's ConfigMap: the policy
// the Deployment runs with.
func (cp *ControlPlane) ShippedGuardConfig(repoRoot string) (string, error) {
	objs, err := cp.Kustomize(filepath.Join(repoRoot, "deploy", "base"))
	if err != nil {
		return "", err
	}
	o, err := Find(objs, "ConfigMap", "gpu-deploy-guard-config")
	if err != nil {
		return "", err
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(o.YAML, &cm); err != nil {
		return "", err
	}
	cfg, ok := cm.Data["config.yaml"]
	if !ok {
		return "", errors.New("deploy/base ConfigMap gpu-deploy-guard-config has no config.yaml")
	}
	return cfg, nil
}

// WriteShippedGuardConfig writes ShippedGuardConfig to dir/config.yaml,
// creating dir, and returns the file's path.
func (cp *ControlPlane) WriteShippedGuardConfig(repoRoot, dir string) (string, error) {
	config, err := cp.ShippedGuardConfig(repoRoot)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "config.yaml")
	return path, os.WriteFile(path, []byte(config), 0o644)
}

// Loopback returns a copy of the shipped configuration in which only each
// webhook's clientConfig differs: url instead of the Service reference, and
// caBundle set. It refuses a configuration whose webhooks do not all call
// path /validate through a Service, so a change in deploy/ is noticed here
// rather than papered over.
func Loopback(shipped *admissionregistrationv1.ValidatingWebhookConfiguration, url string, caBundle []byte) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	if !strings.HasSuffix(url, "/validate") {
		return nil, fmt.Errorf("url %q does not end in /validate", url)
	}
	out := shipped.DeepCopy()
	if len(out.Webhooks) == 0 {
		return nil, errors.New("the shipped ValidatingWebhookConfiguration has no webhooks")
	}
	for i := range out.Webhooks {
		w := &out.Webhooks[i]
		svc := w.ClientConfig.Service
		switch {
		case svc == nil:
			return nil, fmt.Errorf("webhook %s: clientConfig has no service reference", w.Name)
		case svc.Path == nil || !strings.HasPrefix(*svc.Path, "/validate"):
			return nil, fmt.Errorf("webhook %s: service path is %v, not /validate or below it", w.Name, svc.Path)
		case w.ClientConfig.URL != nil:
			return nil, fmt.Errorf("webhook %s: clientConfig already has a url", w.Name)
		}
		// /validate (Nodes) or /validate/gpu-policy (ClusterPolicy, NVIDIADriver).
		u := url + strings.TrimPrefix(*svc.Path, "/validate")
		w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: append([]byte(nil), caBundle...)}
	}
	return out, nil
}

// RegisterGuard applies the shipped ValidatingWebhookConfiguration with its
// clientConfig pointed at g, and checks that the API server stored exactly
// that clientConfig (an earlier apply of an overlay must not leave its
// service reference behind). When the stored object is, to its
// resourceVersion, the one RegisterGuard's last apply of this same manifest
// left, nothing has written it since and the apply is skipped (lab tests
// register the shared webhook at every start; kubectl apply is the dearest
// kubectl call they make).
func (cp *ControlPlane) RegisterGuard(repoRoot string, g *Guard) error {
	shipped, err := cp.ShippedWebhookConfiguration(repoRoot)
	if err != nil {
		return err
	}
	vwc, err := Loopback(shipped, g.URL(), g.CABundle)
	if err != nil {
		return err
	}
	manifest, err := yaml.Marshal(vwc)
	if err != nil {
		return err
	}
	stored, err := cp.storedWebhookConfiguration()
	if err != nil || cp.registered != (registration{string(manifest), string(stored.UID), stored.ResourceVersion}) {
		if _, stderr, code := cp.KubectlWithInput(string(manifest), "apply", "-f", "-"); code != 0 {
			return fmt.Errorf("kubectl apply of the loopback webhook configuration: exit %d: %s", code, strings.TrimSpace(stderr))
		}
		if stored, err = cp.storedWebhookConfiguration(); err != nil {
			return err
		}
		cp.registered = registration{string(manifest), string(stored.UID), stored.ResourceVersion}
	}
	if len(stored.Webhooks) != len(vwc.Webhooks) {
		return fmt.Errorf("stored configuration has %d webhooks, applied %d", len(stored.Webhooks), len(vwc.Webhooks))
	}
	for i, w := range stored.Webhooks {
		cc := w.ClientConfig
		want := *vwc.Webhooks[i].ClientConfig.URL
		if w.Name != vwc.Webhooks[i].Name || cc.Service != nil || cc.URL == nil || *cc.URL != want || !bytes.Equal(cc.CABundle, g.CABundle) {
			return fmt.Errorf("stored webhook %d (%s) has clientConfig url=%v service=%v caBundle %d bytes; want url %s only, caBundle %d bytes",
				i, w.Name, cc.URL, cc.Service, len(cc.CABundle), want, len(g.CABundle))
		}
	}
	return cp.waitGuardConsulted(g)
}

// registration is what RegisterGuard last applied, and the uid and
// resourceVersion of the object the API server stored from it.
type registration struct{ manifest, uid, resourceVersion string }

// storedWebhookConfiguration reads the ValidatingWebhookConfiguration as the
// API server stores it.
func (cp *ControlPlane) storedWebhookConfiguration() (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	stdout, stderr, code := cp.Kubectl("get", "validatingwebhookconfiguration", WebhookConfigurationName, "-o", "yaml")
	if code != 0 {
		return nil, fmt.Errorf("kubectl get validatingwebhookconfiguration: exit %d: %s", code, stderr)
	}
	var stored admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.Unmarshal([]byte(stdout), &stored); err != nil {
		return nil, err
	}
	return &stored, nil
}

// probeNode is never stored: it is only created with --dry-run=server. Its
// deploy label makes the observe webhook's matchConditions send it.
const probeNode = `apiVersion: v1
kind: Node
metadata:
  name: gpu-deploy-guard-probe
  labels:
    nvidia.com/gpu.deploy.driver: "false"
`

// waitGuardConsulted returns once the API server sends reviews to g. The API
// server learns about webhook configurations through an informer, so for a
// moment after an apply it may still use the previous configuration (or
// none): a test that changed labels right away could slip past the webhook.
func (cp *ControlPlane) waitGuardConsulted(g *Guard) error {
	creates := map[string]string{"operation": "CREATE"}
	before, err := g.Counter("gpu_deploy_guard_admission_reviews_total", creates)
	if err != nil {
		return err
	}
	return Poll(30*time.Second, func() (bool, string) {
		if _, stderr, code := cp.KubectlWithInput(probeNode, "create", "--dry-run=server", "-f", "-"); code != 0 {
			return false, fmt.Sprintf("dry-run create of the probe node: exit %d: %s", code, strings.TrimSpace(stderr))
		}
		now, err := g.Counter("gpu_deploy_guard_admission_reviews_total", creates)
		if err != nil {
			return false, err.Error()
		}
		return now > before, fmt.Sprintf("CREATE reviews counted: %v, before the probe: %v", now, before)
	})
}

// WaitGuardConsulted returns once the API server sends reviews to g, for
// webhook configurations registered some other way than RegisterGuard (the
// Helm chart's, through a post-renderer).
func (cp *ControlPlane) WaitGuardConsulted(g *Guard) error { return cp.waitGuardConsulted(g) }
