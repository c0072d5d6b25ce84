package oracle

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// snapshot writes every oracle node (but the sentinel, which settle() changes)
// as `kubectl get node -o json` prints it into dir, and returns the files by
// node name: the input of `check` for what the operator will do next.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal([]byte(cp.MustKubectl(t, "get", "nodes", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, raw := range list.Items {
		var n struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(raw, &n); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(n.Metadata.Name, "oracle-") || n.Metadata.Name == sentinel {
			continue
		}
		f := filepath.Join(dir, n.Metadata.Name+".json")
		if err := os.WriteFile(f, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		files[n.Metadata.Name] = f
	}
	return files
}

// nodeFile writes a Node with these labels, for check to judge its creation.
func nodeFile(t *testing.T, dir, name string, labels map[string]string) string {
	t.Helper()
	data, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "labels": labels},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, name+".json")
	if err := os.WriteFile(f, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// prediction is the part of `check -o json` about the operator.
type prediction struct {
	Operator struct {
		Version     string            `json:"version"`
		Assumed     *string           `json:"assumed"`
		LabelsAfter map[string]string `json:"labelsAfter"`
		Labels      map[string]struct {
			Value  *string `json:"value"`
			Action string  `json:"action"`
			After  *string `json:"after"`
		} `json:"labels"`
	} `json:"operator"`
}

// predict asks check what the operator's next labelling pass leaves on the
// node: the node file, the request's changes, the ClusterPolicy, the version.
func predict(t *testing.T, node string, changes []string, policyFile, version string) prediction {
	t.Helper()
	args := append([]string{"--node", node, "--cluster-policy", policyFile, "--operator-version", version}, changes...)
	var p prediction
	out := runCheckRaw(t, args...)
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("check -o json: %v\n%s", err, out)
	}
	if p.Operator.LabelsAfter == nil {
		t.Fatalf("check -o json has no operator.labelsAfter:\n%s", out)
	}
	return p
}
