package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const (
	operatorNS = "gpu-operator"
	deployKey  = "nvidia.com/gpu.deploy."
)

// The lab's five deploy labels (tests/e2e/testdata/lab-nodes.yaml), one
// per operand DaemonSet of testdata/gpu-operator-daemonsets.yaml.
var labDeployLabels = []string{"driver", "container-toolkit", "device-plugin", "gpu-feature-discovery", "dcgm-exporter"}

// The NVIDIA labels the lab's GPU nodes carry besides the deploy labels:
// nvidia.com/gpu.present (lab-nodes.yaml), and NFD's PCI vendor label for
// NVIDIA (10de) that a GPU node of the fixture's shape has.
var gpuLabels = map[string]string{
	"nvidia.com/gpu.present":                      "true",
	"feature.node.kubernetes.io/pci-10de.present": "true",
}

func nodeName(i int) string { return fmt.Sprintf("scale-node-%05d", i) }

// fleet makes the nodes and operand pods of the benchmark.
type fleet struct {
	cs       *kubernetes.Clientset
	template corev1.Node
	dsets    []appsv1.DaemonSet // the operand DaemonSets, as the API server has them
	workers  int
	logf     func(string, ...any)
	nodes    int // how many exist (scale-node-00000 .. nodes-1)
	broken   bool
	// Every taintEvery-th node (0: none) is quarantined as NVIDIA NVSentinel
	// does after an XID error: a NoSchedule taint the operands do not
	// tolerate, so their pods stay but would not be re-created there.
	taintEvery int
}

// quarantine is the taint of the benchmark's tainted nodes.
var quarantine = corev1.Taint{Key: "nvidia.com/gpu-xid-error", Value: "79", Effect: corev1.TaintEffectNoSchedule}

// loadNodeTemplate reads the large-node fixture and makes it a template:
// server-set metadata dropped, only the lab's five deploy labels (all
// "true") among nvidia.com/gpu.deploy.*, and the lab's GPU labels.
func loadNodeTemplate(path string) (corev1.Node, int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return corev1.Node{}, 0, err
	}
	var n corev1.Node
	if err := json.Unmarshal(data, &n); err != nil {
		return corev1.Node{}, 0, fmt.Errorf("%s: %w", path, err)
	}
	n.ResourceVersion, n.UID, n.CreationTimestamp, n.ManagedFields = "", "", metav1.Time{}, nil
	for k := range n.Labels {
		if strings.HasPrefix(k, deployKey) {
			delete(n.Labels, k)
		}
	}
	for _, op := range labDeployLabels {
		n.Labels[deployKey+op] = "true"
	}
	for k, v := range gpuLabels {
		n.Labels[k] = v
	}
	return n, len(data), nil
}

func (f *fleet) node(i int, now time.Time) *corev1.Node {
	n := f.template.DeepCopy()
	name := nodeName(i)
	n.Name = name
	n.Labels["kubernetes.io/hostname"] = name
	ip := fmt.Sprintf("10.%d.%d.%d", 64+i/65536, (i/256)%256, i%256)
	for j := range n.Status.Addresses {
		switch n.Status.Addresses[j].Type {
		case corev1.NodeHostName:
			n.Status.Addresses[j].Address = name
		case corev1.NodeInternalIP:
			n.Status.Addresses[j].Address = ip
		}
	}
	for j := range n.Status.Conditions {
		n.Status.Conditions[j].LastHeartbeatTime = metav1.NewTime(now)
	}
	n.Spec.ProviderID = ""
	n.Spec.PodCIDR, n.Spec.PodCIDRs = "", nil
	if f.taintEvery > 0 && i%f.taintEvery == 0 {
		n.Spec.Taints = append(n.Spec.Taints, quarantine)
	}
	return n
}

// The tolerations the DaemonSet controller adds to every pod it makes
// (pkg/controller/daemon/util.AddOrUpdateDaemonPodTolerations).
var daemonTolerations = []corev1.Toleration{
	{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: "node.kubernetes.io/disk-pressure", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: "node.kubernetes.io/memory-pressure", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: "node.kubernetes.io/pid-pressure", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: "node.kubernetes.io/unschedulable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
}

// pod is what the DaemonSet controller would create for ds on node, already
// bound (spec.nodeName) as the scheduler would leave it.
func (f *fleet) pod(ds *appsv1.DaemonSet, i int) *corev1.Pod {
	node := nodeName(i)
	t := ds.Spec.Template.DeepCopy()
	labels := map[string]string{"controller-revision-hash": "6f9c8d7b5", "pod-template-generation": "1"}
	for k, v := range t.Labels {
		labels[k] = v
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("%s-%05d", ds.Name, i),
			Namespace:   ds.Namespace,
			Labels:      labels,
			Annotations: t.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID,
				Controller: ptr(true), BlockOwnerDeletion: ptr(true),
			}},
		},
		Spec: t.Spec,
	}
	p.Spec.NodeName = node
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}}
	p.Spec.Tolerations = append(p.Spec.Tolerations, daemonTolerations...)
	return p
}

// runningStatus is a kubelet's status of a started pod.
func runningStatus(p *corev1.Pod, i int, now time.Time) corev1.PodStatus {
	t := metav1.NewTime(now)
	ip := fmt.Sprintf("10.%d.%d.%d", 64+i/65536, (i/256)%256, i%256)
	st := corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    ip,
		HostIPs:   []corev1.HostIP{{IP: ip}},
		PodIP:     ip,
		PodIPs:    []corev1.PodIP{{IP: ip}},
		StartTime: &t,
		QOSClass:  corev1.PodQOSBestEffort,
	}
	for _, c := range []corev1.PodConditionType{"PodReadyToStartContainers", corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: t})
	}
	for j, c := range p.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image + "@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a",
			ContainerID: fmt.Sprintf("containerd://%064x", uint64(i)*16+uint64(j)),
			Ready:       true, Started: ptr(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: t}},
		})
	}
	return st
}

func ptr[T any](v T) *T { return &v }

// fillStats says how long growing the fleet took.
type fillStats struct {
	Nodes   int     `json:"nodes"` // created in this step
	Pods    int     `json:"pods"`
	Seconds float64 `json:"seconds"` // wall time
	Errors  int64   `json:"errors"`
}

// grow creates nodes f.nodes .. n-1 with their operand pods (created, then
// set Running through the status subresource), with f.workers workers.
func (f *fleet) grow(ctx context.Context, n int) (fillStats, error) {
	start := time.Now()
	from := f.nodes
	if n <= from {
		return fillStats{}, nil
	}
	jobs := make(chan int)
	var nodesDone, podsDone, errs atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) {
		errs.Add(1)
		firstErr.CompareAndSwap(nil, err)
	}
	var wg sync.WaitGroup
	for w := 0; w < f.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := f.makeNode(ctx, i); err != nil {
					fail(err)
					continue
				}
				nodesDone.Add(1)
				for d := range f.dsets {
					if err := f.makePod(ctx, &f.dsets[d], i); err != nil {
						fail(err)
						continue
					}
					podsDone.Add(1)
				}
			}
		}()
	}
	stopProgress := make(chan struct{})
	go func() {
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-tick.C:
				el := time.Since(start).Seconds()
				nd, pd := nodesDone.Load(), podsDone.Load()
				f.logf("fill: %d/%d nodes, %d pods in %.0f s (%.0f nodes/s, %.0f pods/s), %d errors",
					nd, n-from, pd, el, float64(nd)/el, float64(pd)/el, errs.Load())
			}
		}
	}()
	for i := from; i < n && ctx.Err() == nil; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	close(stopProgress)
	st := fillStats{Nodes: int(nodesDone.Load()), Pods: int(podsDone.Load()), Seconds: time.Since(start).Seconds(), Errors: errs.Load()}
	if err, _ := firstErr.Load().(error); err != nil {
		return st, fmt.Errorf("%d errors creating the fleet, the first: %w", st.Errors, err)
	}
	f.nodes = n
	return st, ctx.Err()
}

func (f *fleet) makeNode(ctx context.Context, i int) error {
	n := f.node(i, time.Now())
	created, err := f.cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{FieldManager: "kubelet"})
	if err != nil {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	// A kubelet registers its node with a status; should the API server
	// drop it on create, put it back as the kubelet's first update would.
	if len(created.Status.Images) == 0 && len(n.Status.Images) > 0 {
		created.Status = n.Status
		if _, err := f.cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{FieldManager: "kubelet"}); err != nil {
			return fmt.Errorf("status of node %s: %w", n.Name, err)
		}
	}
	return nil
}

func (f *fleet) makePod(ctx context.Context, ds *appsv1.DaemonSet, i int) error {
	p := f.pod(ds, i)
	pods := f.cs.CoreV1().Pods(ds.Namespace)
	created, err := pods.Create(ctx, p, metav1.CreateOptions{FieldManager: "kube-controller-manager"})
	if apierrors.IsAlreadyExists(err) {
		created, err = pods.Get(ctx, p.Name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("create pod %s: %w", p.Name, err)
	}
	if created.Status.Phase == corev1.PodRunning {
		return nil
	}
	// A broken fleet: the toolkit never starts, under a Running device plugin.
	if f.broken && ds.Name == "nvidia-container-toolkit-daemonset" {
		return nil
	}
	created.Status = runningStatus(created, i, time.Now())
	if _, err := pods.UpdateStatus(ctx, created, metav1.UpdateOptions{FieldManager: "kubelet"}); err != nil {
		return fmt.Errorf("status of pod %s: %w", p.Name, err)
	}
	return nil
}
