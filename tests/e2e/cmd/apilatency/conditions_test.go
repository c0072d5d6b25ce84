package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"

	"gpu-deploy-guard/tests/e2e/framework"
)

// The configurations measured with -variants file=... must send exactly the
// requests deploy/base sends, to the same webhook: this evaluates every
// webhook's matchConditions with the API server's own matcher over a grid of
// users, operations and label changes and compares the outcome (call, skip,
// or an evaluation error that the failurePolicy decides). Everything but
// the matchConditions must be identical.
var variantFiles = []string{"merged-conditions.yaml"}

func loadVWC(t *testing.T, path string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := yaml.UnmarshalStrict(data, vwc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return vwc
}

func compile(w admissionregistrationv1.ValidatingWebhook) matchconditions.Matcher {
	var exprs []plugincel.ExpressionAccessor
	for _, c := range w.MatchConditions {
		exprs = append(exprs, &matchconditions.MatchCondition{Name: c.Name, Expression: c.Expression})
	}
	compiler := plugincel.NewConditionCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion(), true))
	return matchconditions.NewMatcher(compiler.CompileCondition(exprs,
		plugincel.OptionalVariableDeclarations{HasAuthorizer: true, StrictCost: true}, environment.StoredExpressions),
		w.FailurePolicy, "webhook", "validating", w.Name)
}

func outcome(m matchconditions.Matcher, attr *admission.VersionedAttributes) string {
	r := m.Match(context.Background(), attr, nil, nil)
	switch {
	case r.Error != nil:
		return "error"
	case r.Matches:
		return "call"
	}
	return "skip"
}

func TestVariantFilesMatchLikeDeployBase(t *testing.T) {
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	shipped := loadVWC(t, filepath.Join(root, "deploy", "base", "validatingwebhookconfiguration.yaml"))

	users := map[string]user.Info{
		"admin":          &user.DefaultInfo{Name: "kubernetes-admin", Groups: []string{"system:masters", "system:authenticated"}},
		"person":         &user.DefaultInfo{Name: "alice"},
		"nameless":       &user.DefaultInfo{},
		"operator":       &user.DefaultInfo{Name: "system:serviceaccount:gpu-operator:gpu-operator", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:gpu-operator", "system:authenticated"}},
		"other-sa":       &user.DefaultInfo{Name: "system:serviceaccount:default:builder", Groups: []string{"system:serviceaccounts"}},
		"operator-ns-lo": &user.DefaultInfo{Name: "system:serviceaccount:gpu-operator-x:y"},
		"node":           &user.DefaultInfo{Name: "system:node:n1", Groups: []string{"system:nodes", "system:authenticated"}},
		"node-group":     &user.DefaultInfo{Name: "someone", Groups: []string{"system:nodes"}},
	}
	const d = "nvidia.com/gpu.deploy."
	labelSets := map[string]map[string]string{
		"nil":       nil,
		"empty":     {},
		"unrelated": {"kubernetes.io/hostname": "n1"},
		"dp=true":   {d + "device-plugin": "true", "kubernetes.io/hostname": "n1"},
		"dp=false":  {d + "device-plugin": "false", "kubernetes.io/hostname": "n1"},
		"dp+tk":     {d + "device-plugin": "true", d + "container-toolkit": "true"},
		"tk":        {d + "container-toolkit": "true"},
		"near-miss": {"nvidia.com/gpu.deployx": "true", "nvidia.com/gpu.present": "true"},
	}
	node := func(labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: labels}}
	}
	gvk := corev1.SchemeGroupVersion.WithKind("Node")
	gvr := corev1.SchemeGroupVersion.WithResource("nodes")
	attr := func(op admission.Operation, obj, old *corev1.Node, u user.Info) *admission.VersionedAttributes {
		var o, oo runtime.Object = obj, nil
		if old != nil {
			oo = old
		}
		return &admission.VersionedAttributes{
			Attributes:      admission.NewAttributesRecord(o, oo, gvk, "", "n1", gvr, "", op, nil, false, u),
			VersionedObject: o, VersionedOldObject: oo, VersionedKind: gvk,
		}
	}

	for _, file := range variantFiles {
		t.Run(file, func(t *testing.T) {
			variant := loadVWC(t, filepath.Join(root, "tests", "e2e", "testdata", "apilatency", file))
			if len(variant.Webhooks) != len(shipped.Webhooks) {
				t.Fatalf("%d webhooks, deploy/base has %d", len(variant.Webhooks), len(shipped.Webhooks))
			}
			for i := range shipped.Webhooks {
				a, b := shipped.Webhooks[i].DeepCopy(), variant.Webhooks[i].DeepCopy()
				a.MatchConditions, b.MatchConditions = nil, nil
				ja, _ := yaml.Marshal(a)
				jb, _ := yaml.Marshal(b)
				if string(ja) != string(jb) {
					t.Fatalf("webhook %d differs from deploy/base in more than matchConditions:\n%s\nvs\n%s", i, jb, ja)
				}
			}
			var cases, calls int
			for i := range shipped.Webhooks {
				want, got := compile(shipped.Webhooks[i]), compile(variant.Webhooks[i])
				check := func(what string, a *admission.VersionedAttributes) {
					cases++
					w, g := outcome(want, a), outcome(got, a)
					if w == "call" {
						calls++
					}
					if w != g {
						t.Errorf("%s, %s: deploy/base %s, %s %s", shipped.Webhooks[i].Name, what, w, file, g)
					}
				}
				for un, u := range users {
					for nn, newLabels := range labelSets {
						check(fmt.Sprintf("CREATE by %s with labels %s", un, nn), attr(admission.Create, node(newLabels), nil, u))
						for on, oldLabels := range labelSets {
							check(fmt.Sprintf("UPDATE by %s, labels %s -> %s", un, on, nn), attr(admission.Update, node(newLabels), node(oldLabels), u))
						}
					}
				}
			}
			if calls == 0 {
				t.Fatal("no case calls a webhook; the grid is wrong")
			}
			t.Logf("%d cases, %d of them call a webhook: the same outcome", cases, calls)
		})
	}
}
