package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// eventController is the reportingController of the guard's Events; the
// core/v1 view of an Event calls it reportingComponent.
const eventController = "nvidia.com/gpu-deploy-guard"

// nodeEvent is one of the guard's Events as `kubectl get events` shows it.
type nodeEvent struct {
	node, reason, action, message, instance, kind, uid, eventType string
}

// guardNodeEvents lists the guard's Events on Nodes, as a platform engineer
// would: kubectl get events --field-selector involvedObject.kind=Node,
// narrowed to the guard's reportingController.
func guardNodeEvents(t *testing.T) []nodeEvent {
	t.Helper()
	out := cp.MustKubectl(t, "get", "events", "-A", "-o", "json",
		"--field-selector", "involvedObject.kind=Node,reportingComponent="+eventController)
	var list struct {
		Items []struct {
			InvolvedObject struct {
				Kind, Name, UID, Namespace string
			} `json:"involvedObject"`
			Reason, Action, Message, Type string
			ReportingComponent            string `json:"reportingComponent"`
			ReportingInstance             string `json:"reportingInstance"`
			Metadata                      struct {
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	var events []nodeEvent
	for _, e := range list.Items {
		if e.ReportingComponent != eventController || e.Metadata.Namespace != "default" || e.InvolvedObject.Namespace != "" {
			t.Errorf("an Event of the guard outside what it writes: %+v", e)
		}
		events = append(events, nodeEvent{e.InvolvedObject.Name, e.Reason, e.Action, e.Message,
			e.ReportingInstance, e.InvolvedObject.Kind, e.InvolvedObject.UID, e.Type})
	}
	return events
}

// watchingInstance is the reportingInstance of startWatchingGuard's Events
// (its POD_NAME). The shared guard audits the lab too, under another name.
const watchingInstance = "gpu-deploy-guard-watching"

// eventsOf keeps the watching guard's Events on node with this reason and
// action.
func eventsOf(events []nodeEvent, node, reason, action string) []nodeEvent {
	var out []nodeEvent
	for _, e := range events {
		if e.instance == watchingInstance && e.node == node && e.reason == reason && e.action == action {
			out = append(out, e)
		}
	}
	return out
}

// TestEventsOnTheNodeForARefusalAndAnAuditFinding runs a watching guard with
// the shipped RBAC (the chart's Role for Events in namespace default) and
// the webhook pointed at it. A refused kubectl label writes one Event on the
// Node naming the rule and the user; the same refusal again within the
// window writes none (the rate limit counts it). The operator's service
// account then sets the same state (exempt): the auditor finds the finding
// the node gained and writes an Event for it. Both show in kubectl describe
// node.
func TestEventsOnTheNodeForARefusalAndAnAuditFinding(t *testing.T) {
	setUpLab(t)
	t.Cleanup(func() { resetLab(t) })
	installWatchedCRDs(t)
	// Events of earlier tests (the shared guard writes them too) would make the
	// counts below ambiguous.
	cp.MustKubectl(t, "delete", "events", "-n", "default", "--field-selector", "reportingComponent="+eventController)
	g := startWatchingGuard(t)
	register(t, g)
	// The auditor's first pass is the baseline, which gains nothing: wait for it
	// before changing anything.
	framework.WaitFor(t, watchFollow, "the auditor's first pass", func() (bool, string) {
		text, err := auditGauges(g)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(text, "audit_nodes 3"), text
	})
	metric := func(name string, labels map[string]string) float64 {
		t.Helper()
		v, err := g.Counter(metricPrefix+name, labels)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// A person's change the webhook refuses.
	label := []string{"label", "node", "lab-node-2", labNode2PluginOnly}
	got := kubectl(label...)
	if got.code != 1 || !strings.Contains(got.stderr, forbiddenPrefix) {
		t.Fatalf("kubectl label node lab-node-2 device-plugin=true: want the refusal, got %s", got)
	}
	var refusal nodeEvent
	framework.WaitFor(t, watchFollow, "the refusal's Event on lab-node-2", func() (bool, string) {
		found := eventsOf(guardNodeEvents(t), "lab-node-2", "DevicePluginWithoutToolkit", "Refuse")
		if len(found) != 1 {
			return false, fmt.Sprintf("%+v", found)
		}
		refusal = found[0]
		return true, ""
	})
	t.Logf("the refusal's Event: %+v", refusal)
	if refusal.kind != "Node" || refusal.uid != "lab-node-2" || refusal.eventType != "Warning" {
		t.Errorf("the refusal's Event: %+v", refusal)
	}
	if !strings.HasPrefix(refusal.message, "refused a change by ") ||
		!strings.Contains(refusal.message, ": node lab-node-2: nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA device plugin without the container toolkit") {
		t.Errorf("the refusal's Event says %q", refusal.message)
	}
	// The refusal's other findings are warnings: no Event for them.
	for _, e := range guardNodeEvents(t) {
		if e.instance == watchingInstance && e.action == "Refuse" && e.reason != "DevicePluginWithoutToolkit" {
			t.Errorf("an Event for a rule that did not refuse: %+v", e)
		}
	}

	// The same refusal again, within the window: refused, counted as rate
	// limited, and no second Event.
	limited := map[string]string{"source": "refusal", "reason": "rate-limited"}
	before := metric("events_dropped_total", limited)
	got = kubectl(label...)
	if got.code != 1 || !strings.Contains(got.stderr, forbiddenPrefix) {
		t.Fatalf("the same label again: want the refusal, got %s", got)
	}
	if after := metric("events_dropped_total", limited); after != before+1 {
		t.Errorf("events_dropped_total{reason=rate-limited} went %v -> %v, want one more", before, after)
	}
	if found := eventsOf(guardNodeEvents(t), "lab-node-2", "DevicePluginWithoutToolkit", "Refuse"); len(found) != 1 {
		t.Errorf("after the second refusal: %d refusal Events, want 1: %+v", len(found), found)
	}
	if sent := metric("events_sent_total", map[string]string{"source": "refusal"}); sent != 1 {
		t.Errorf("events_sent_total{source=refusal} = %v, want 1", sent)
	}

	// The operator's service account sets the same state (exempt): the node
	// gains the finding, and the auditor writes its Event.
	got = kubectlAsOperator(label...)
	expectResult(t, "kubectl label node lab-node-2 device-plugin=true --as="+operatorSA, got, 0, "node/lab-node-2 labeled\n", "")
	var finding nodeEvent
	framework.WaitFor(t, watchFollow, "the audit finding's Event on lab-node-2", func() (bool, string) {
		found := eventsOf(guardNodeEvents(t), "lab-node-2", "DevicePluginWithoutToolkit", "Audit")
		if len(found) != 1 {
			return false, fmt.Sprintf("%+v", found)
		}
		finding = found[0]
		return true, ""
	})
	t.Logf("the audit finding's Event: %+v", finding)
	if !strings.HasPrefix(finding.message, "node lab-node-2 runs the NVIDIA device plugin") || finding.eventType != "Warning" {
		t.Errorf("the audit finding's Event: %+v", finding)
	}
	if n := findingsOf(t, g, "device-plugin-without-toolkit"); n != 1 {
		t.Errorf("audit_findings{rule=device-plugin-without-toolkit} = %v, want 1", n)
	}
	// Only lab-node-2 changed: no Event on the other nodes.
	for _, e := range guardNodeEvents(t) {
		if e.instance == watchingInstance && e.node != "lab-node-2" {
			t.Errorf("an Event on a node that gained nothing: %+v", e)
		}
	}

	// The device plugin's pod starts on lab-node-2: passes over the node that
	// find the finding again write no second Event.
	framework.WaitFor(t, 60*time.Second, "the device plugin Running on lab-node-2", func() (bool, string) {
		for _, p := range operandPods(t) {
			if p.daemonSet == "nvidia-device-plugin-daemonset" && p.node == "lab-node-2" {
				return p.phase == "Running", p.name + " " + p.phase
			}
		}
		return false, "no pod"
	})
	time.Sleep(3 * time.Second)
	if found := eventsOf(guardNodeEvents(t), "lab-node-2", "DevicePluginWithoutToolkit", "Audit"); len(found) != 1 {
		t.Errorf("after more passes over lab-node-2: %d audit Events of the finding, want 1: %+v", len(found), found)
	}

	// kubectl describe node shows both, from the guard.
	describe := cp.MustKubectl(t, "describe", "node", "lab-node-2")
	at := strings.Index(describe, "\nEvents:")
	if at < 0 {
		t.Fatalf("kubectl describe node lab-node-2 has no Events section:\n%s", describe)
	}
	section := describe[at:]
	t.Logf("kubectl describe node lab-node-2%s", section)
	ours := 0
	for _, line := range strings.Split(section, "\n") {
		// kubectl 1.33 shows reportingController as From, not the instance.
		if strings.Contains(line, "DevicePluginWithoutToolkit") && strings.Contains(line, eventController) {
			ours++
		}
	}
	if ours != 2 {
		t.Errorf("kubectl describe node lab-node-2 lists %d DevicePluginWithoutToolkit Events from %s, want 2:\n%s",
			ours, eventController, section)
	}
	for _, says := range []string{"refused a change by ", "node lab-node-2 runs the NVIDIA device plugin"} {
		if !strings.Contains(section, says) {
			t.Errorf("kubectl describe node lab-node-2 does not show %q:\n%s", says, section)
		}
	}
}
