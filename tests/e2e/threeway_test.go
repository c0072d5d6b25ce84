package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gpu-deploy-guard/tests/e2e/framework"
)

// One GPU-policy change, decided three ways over the same objects: by the
// webhook (a server-side dry run through kubectl), by the kubectl plugin's
// preview (which reads the live cluster), and by `check-policy` (offline,
// over the objects the test reads from the cluster and writes to files).

// answer is what a decision says, in the words each of the three gives.
type answer struct {
	Decision string
	// The refusal's message; empty when allowed.
	Message  string
	Warnings []string
}

// policyJSON is `check-policy -o json`, which the plugin's `-o json` shares.
type policyJSON struct {
	Decision string   `json:"decision"`
	Message  *string  `json:"message"`
	Warnings []string `json:"warnings"`
	Findings []struct {
		Rule   string `json:"rule"`
		Action string `json:"action"`
	} `json:"findings"`
	Operands json.RawMessage `json:"operands"`
}

func (p policyJSON) answer() answer {
	a := answer{Decision: p.Decision, Warnings: slices.Clone(p.Warnings)}
	if p.Message != nil && p.Decision == "denied" {
		a.Message = *p.Message
	}
	slices.Sort(a.Warnings)
	return a
}

func (p policyJSON) rules() []string {
	var ids []string
	for _, f := range p.Findings {
		ids = append(ids, f.Action+" "+f.Rule)
	}
	return ids
}

func decodePolicyJSON(t *testing.T, what string, got result) policyJSON {
	t.Helper()
	if got.code != 0 && got.code != 1 {
		t.Fatalf("%s: want exit 0 or 1\ngot %s", what, got)
	}
	var p policyJSON
	if err := json.Unmarshal([]byte(got.stdout), &p); err != nil {
		t.Fatalf("%s: not its JSON report: %v\n%s", what, err, got)
	}
	return p
}

// webhookAnswer reads kubectl's output of a server-side dry run: its
// warnings, and the policy webhook's refusal.
func webhookAnswer(t *testing.T, what string, got result) answer {
	t.Helper()
	a := answer{Decision: "allowed"}
	for _, line := range strings.Split(got.stderr, "\n") {
		if w, ok := strings.CutPrefix(line, "Warning: "); ok {
			a.Warnings = append(a.Warnings, w)
		}
		if _, message, ok := strings.Cut(line, policyDenied); ok {
			a.Decision, a.Message = "denied", message
		}
	}
	slices.Sort(a.Warnings)
	if (got.code == 0) != (a.Decision == "allowed") {
		t.Fatalf("%s: the webhook's answer is neither allowed nor refused by it\ngot %s", what, got)
	}
	return a
}

// writeFile writes text to a file of the test's temporary directory.
func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// otherDrivers is the live NVIDIADriver list without the one named.
func otherDrivers(t *testing.T, name string) string {
	t.Helper()
	var list map[string]any
	if err := json.Unmarshal([]byte(cp.MustKubectl(t, "get", "nvidiadrivers", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	items, _ := list["items"].([]any)
	kept := []any{}
	for _, item := range items {
		if meta, _ := item.(map[string]any)["metadata"].(map[string]any); meta["name"] != name {
			kept = append(kept, item)
		}
	}
	list["items"] = kept
	out, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// policyChange is one change, as each of the three is asked it.
type policyChange struct {
	what string
	// kubectl's arguments for the server-side dry run (stdin: manifest).
	webhook  []string
	manifest string
	// The plugin's arguments (after `policy`, before `-o json`).
	plugin []string
	// check-policy's changed objects: the live object's name (kind "clusterpolicy" or
	// "nvidiadriver") as --old, and the new object as --new ("" for none).
	kind, old, new string
}

// checkPolicy runs check-policy over the cluster's objects as they are now.
func checkPolicy(t *testing.T, c policyChange) result {
	t.Helper()
	dir := t.TempDir()
	args := []string{"check-policy", "-o", "json",
		"--nodes", writeFile(t, dir, "nodes.json", cp.MustKubectl(t, "get", "nodes", "-o", "json")),
		"--cluster-policy", writeFile(t, dir, "cp.json", cp.MustKubectl(t, "get", "clusterpolicy", clusterPolicyName, "-o", "json")),
		"--nvidia-drivers", writeFile(t, dir, "drivers.json", otherDrivers(t, c.changedDriver(t))),
		"--daemonsets", writeFile(t, dir, "ds.json", cp.MustKubectl(t, "get", "daemonsets", "-n", "gpu-operator", "-o", "json")),
	}
	if c.old != "" {
		args = append(args, "--old", writeFile(t, dir, "old.json", cp.MustKubectl(t, "get", c.kind, c.old, "-o", "json")))
	}
	if c.new != "" {
		args = append(args, "--new", writeFile(t, dir, "new.json", c.new))
	}
	return product(t, nil, args...)
}

// changedDriver is the name of the NVIDIADriver the change makes ("" for a
// ClusterPolicy): the other NVIDIADrivers are every one but it.
func (c policyChange) changedDriver(t *testing.T) string {
	if c.kind != "nvidiadriver" || c.old != "" {
		return c.old
	}
	var obj struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(c.new), &obj); err != nil {
		t.Fatalf("%s: the new NVIDIADriver is not JSON: %v", c.what, err)
	}
	return obj.Metadata.Name
}

// expectThreeAgree asks the three and requires the same decision, refusal and
// warnings, and from the plugin and check-policy the same findings and the
// same prediction of where each operand runs. It returns the rules found.
func expectThreeAgree(t *testing.T, c policyChange) []string {
	t.Helper()
	hook := webhookAnswer(t, c.what+": the webhook", kubectlWithInput(c.manifest, append(c.webhook, "--dry-run=server")...))
	plugin := decodePolicyJSON(t, c.what+": the plugin", kubectlPlugin(t, append(append([]string{"policy"}, c.plugin...), "-o", "json")...))
	offline := decodePolicyJSON(t, c.what+": check-policy", checkPolicy(t, c))
	if got := plugin.answer(); !equalAnswers(got, hook) {
		t.Errorf("%s: the plugin and the webhook disagree\nplugin:  %+v\nwebhook: %+v", c.what, got, hook)
	}
	if got := offline.answer(); !equalAnswers(got, hook) {
		t.Errorf("%s: check-policy and the webhook disagree\ncheck-policy: %+v\nwebhook:      %+v", c.what, got, hook)
	}
	if !slices.Equal(plugin.rules(), offline.rules()) || string(plugin.Operands) != string(offline.Operands) {
		t.Errorf("%s: the plugin and check-policy disagree\nplugin:       %v %s\ncheck-policy: %v %s",
			c.what, plugin.rules(), plugin.Operands, offline.rules(), offline.Operands)
	}
	t.Logf("%s: %s %v", c.what, hook.Decision, offline.rules())
	return offline.rules()
}

func equalAnswers(a, b answer) bool {
	return a.Decision == b.Decision && a.Message == b.Message && slices.Equal(a.Warnings, b.Warnings)
}

// patchPolicy is a merge patch of the lab's ClusterPolicy, asked three ways.
func patchPolicy(t *testing.T, what, patch string) policyChange {
	t.Helper()
	return policyChange{
		what:    what,
		webhook: []string{"patch", "clusterpolicy", clusterPolicyName, "--type=merge", "-p", patch},
		plugin:  []string{"clusterpolicy", clusterPolicyName, "--patch", patch},
		kind:    "clusterpolicy",
		old:     clusterPolicyName,
		new: cp.MustKubectl(t, "patch", "clusterpolicy", clusterPolicyName, "--type=merge", "-p", patch,
			"--dry-run=client", "-o", "json"),
	}
}

// createDriver is an NVIDIADriver created, asked three ways.
func createDriver(t *testing.T, what, manifest string) policyChange {
	t.Helper()
	return policyChange{
		what:     what,
		webhook:  []string{"create", "-f", "-"},
		manifest: manifest,
		plugin:   []string{"-f", writeFile(t, t.TempDir(), "driver.json", manifest)},
		kind:     "nvidiadriver",
		new:      manifest,
	}
}

// deleteDriver is an NVIDIADriver deleted, asked three ways.
func deleteDriver(what, name string) policyChange {
	return policyChange{
		what:    what,
		webhook: []string{"delete", "nvidiadriver", name},
		plugin:  []string{"nvidiadriver", name, "--delete"},
		kind:    "nvidiadriver",
		old:     name,
	}
}

// TestCheckPolicyThePluginAndTheWebhookGiveTheSameAnswer: the same GPU-policy
// changes (ClusterPolicy patches, NVIDIADrivers created and deleted, with
// useNvidiaDriverCRD on and then off) asked of the webhook, the plugin and
// check-policy over the same objects get the same decision, refusal and
// warnings from all three, and the same findings and operand prediction from
// the two that print them. Each change is also required to find what it is
// there for, so that three empty answers cannot agree by accident.
func TestCheckPolicyThePluginAndTheWebhookGiveTheSameAnswer(t *testing.T) {
	setUpPolicyLab(t)
	setUpDriverPools(t)
	everywhere := nvidiaDriver("everywhere", `{}`)
	// The guard has read pool-a and the pool labels once it refuses an overlap with it.
	framework.WaitFor(t, watchFollow, "the watching guard to refuse an NVIDIADriver overlapping pool-a", func() (bool, string) {
		got := kubectlWithInput(everywhere, "create", "-f", "-", "--dry-run=server")
		return strings.Contains(got.stderr, "NVIDIADriver pool-a selects too"), got.String()
	})

	for _, c := range []struct {
		change policyChange
		want   string
	}{
		{patchPolicy(t, "toolkit switched off", `{"spec":{"toolkit":{"enabled":false}}}`), "deny toolkit-switched-off"},
		{patchPolicy(t, "CDI switched off", `{"spec":{"cdi":{"enabled":false}}}`), "warn runtime-classes-removed"},
		{patchPolicy(t, "the device plugin switched off", `{"spec":{"devicePlugin":{"enabled":false}}}`), "warn device-plugin-switched-off"},
		{createDriver(t, "an NVIDIADriver over every node", everywhere), "deny nvidia-driver-overlap"},
		{deleteDriver("pool-a deleted", "pool-a"), "warn driver-removed"},
		{patchPolicy(t, "useNvidiaDriverCRD true -> false", `{"spec":{"driver":{"useNvidiaDriverCRD":false}}}`), "warn driver-selected-twice"},
	} {
		if rules := expectThreeAgree(t, c.change); !slices.Contains(rules, c.want) {
			t.Errorf("%s: want %q among the findings, got %v", c.change.what, c.want, rules)
		}
	}

	// With the flag off, an NVIDIADriver deploys nothing (the guard follows v26.7 here: no
	// operator Deployment in the lab), and all three say so.
	if got := kubectl("patch", "clusterpolicy", clusterPolicyName, "--type=merge", "-p", `{"spec":{"driver":{"useNvidiaDriverCRD":false}}}`); got.code != 0 {
		t.Fatalf("turning useNvidiaDriverCRD off: %s", got)
	}
	framework.WaitFor(t, watchFollow, "the watching guard to read useNvidiaDriverCRD off", func() (bool, string) {
		got := kubectlWithInput(nvidiaDriver("pool-b", `{"`+driverPoolKey+`":"b"}`), "create", "-f", "-", "--dry-run=server")
		return strings.Contains(got.stderr, "useNvidiaDriverCRD off"), got.String()
	})
	c := createDriver(t, "an NVIDIADriver created with the flag off", nvidiaDriver("pool-b", `{"`+driverPoolKey+`":"b"}`))
	if rules := expectThreeAgree(t, c); !slices.Equal(rules, []string{"warn nvidia-driver-not-reconciled"}) {
		t.Errorf("%s: want only nvidia-driver-not-reconciled, got %v", c.what, rules)
	}
}
