package framework

import (
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// kube-scheduler and kwok stand in for what a cluster's nodes do with pods:
//
//   - kube-scheduler binds each pod to a node, as in a real cluster. The
//     DaemonSet controller names its pod's node in a required node affinity;
//     the scheduler still runs every filter over it, taints included. Binding
//     is not cosmetic: the DaemonSet controller reacts to a Node label change
//     only for pods it finds on that node by spec.nodeName.
//   - kwok (sigs.k8s.io/kwok, run outside the cluster) plays the kubelet of
//     every node: it reports the node Ready with room for pods (the
//     scheduler's NodeResourcesFit refuses a node without
//     status.allocatable), renews the node's Lease in kube-node-lease, runs
//     the pods bound to it, and finishes their graceful deletion. The
//     stages below say how.
//
// No container runs anywhere; a "Running" pod is a status kwok wrote.

// KwokLeaseDurationSeconds is the node Lease duration kwok keeps (the
// kubelet's default); it renews each Lease every quarter of it.
const KwokLeaseDurationSeconds = 40

// kwokStages is kwok's configuration: what it does to a Node or Pod in
// which state. A stage applies to the objects its selector matches (jq
// expressions over the object); its steps patch the object's status or
// delete it. Heartbeats are the Leases alone: no stage rewrites a Ready
// node's status, so a test that writes node status itself (a heartbeat, a
// capacity) reads back exactly what it wrote.
const kwokStages = `# Written by the e2e framework (framework/scheduling.go).
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  # A node not (or no longer) Ready: report it Ready, with room for pods
  # unless it already states its capacity.
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select(.type == "Ready") | .status'
      operator: NotIn
      values: ["True"]
  steps:
  - patch:
      subresource: status
      root: status
      template: |
        {{ $now := Now }}
        conditions:
        - type: Ready
          status: "True"
          reason: KubeletReady
          message: kwok reports the node Ready
          lastHeartbeatTime: {{ $now | Quote }}
          lastTransitionTime: {{ $now | Quote }}
        {{ if not .status.allocatable }}
        allocatable:
          cpu: "64"
          memory: 256Gi
          pods: "110"
        {{ end }}
        {{ if not .status.capacity }}
        capacity:
          cpu: "64"
          memory: 256Gi
          pods: "110"
        {{ end }}
        nodeInfo:
          architecture: amd64
          operatingSystem: linux
          kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: daemonset-pod-running
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  # A DaemonSet's pod bound to a node that has never started: it runs, its
  # containers ready. Once started (status.startTime set) kwok leaves the
  # pod's status alone, so a test can set it Pending and back, as a kubelet
  # would report a restarting operand. Pods of other owners (the webhook's
  # own Deployment in the install tests) are bound but never started: no
  # image runs here, and those tests prove what a release whose pods never
  # become ready does.
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.startTime'
      operator: DoesNotExist
    - key: '.metadata.ownerReferences.[].kind'
      operator: In
      values: ["DaemonSet"]
  steps:
  - patch:
      subresource: status
      root: status
      template: |
        {{ $now := Now }}
        phase: Running
        startTime: {{ $now | Quote }}
        conditions:
        - type: Initialized
          status: "True"
          lastTransitionTime: {{ $now | Quote }}
        - type: ContainersReady
          status: "True"
          lastTransitionTime: {{ $now | Quote }}
        - type: Ready
          status: "True"
          lastTransitionTime: {{ $now | Quote }}
        containerStatuses:
        {{ range .spec.containers }}
        - name: {{ .name | Quote }}
          image: {{ .image | Quote }}
          ready: true
          started: true
          restartCount: 0
          state:
            running:
              startedAt: {{ $now | Quote }}
        {{ end }}
        initContainerStatuses:
        {{ range .spec.initContainers }}
        - name: {{ .name | Quote }}
          image: {{ .image | Quote }}
          ready: true
          restartCount: 0
          state:
            terminated:
              exitCode: 0
              reason: Completed
              startedAt: {{ $now | Quote }}
              finishedAt: {{ $now | Quote }}
        {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-deleted
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  # Graceful deletion of a pod bound to a node: its containers are gone at
  # once, so the pod object goes.
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: Exists
  steps:
  - delete: true
`

// startScheduler runs kube-scheduler as the admin identity, alone (no
// leader election), and returns once it serves /healthz.
func (cp *ControlPlane) startScheduler() error {
	kubeconfig := cp.KubeconfigPath
	return retryOnEarlyExit("kube-scheduler", func() (*process, error) {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		args := []string{
			"--kubeconfig=" + kubeconfig,
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + filepath.Join(cp.Dir, "scheduler-certs"),
			"--leader-elect=false", // sole instance: schedule at once
		}
		args = append(args, cp.cfg.ExtraSchedulerArgs...)
		p, err := startProcess("kube-scheduler", filepath.Join(cp.cfg.BinDir, "kube-scheduler"), args, cp.LogDir)
		if err != nil {
			return nil, err
		}
		cp.sched = p
		// Its serving certificate is self-signed and generated at start.
		insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		return p, waitHealthy(p, 60*time.Second, func() (bool, string) {
			return httpOK(insecure, "https://127.0.0.1:"+strconv.Itoa(port)+"/healthz", "ok")
		})
	})
}

// startKwok runs kwok with kwokStages for every Node of the cluster (all of
// them are API objects without a kubelet, whoever creates them: the lab, a
// test's extra node, the operator oracle's nodes), as the admin identity,
// and returns once it serves /healthz, which it does only after its
// watches are running.
func (cp *ControlPlane) startKwok() error {
	stages := filepath.Join(cp.Dir, "kwok-stages.yaml")
	if err := os.WriteFile(stages, []byte(kwokStages), 0o644); err != nil {
		return err
	}
	return retryOnEarlyExit("kwok", func() (*process, error) {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		args := []string{
			"--kubeconfig=" + cp.KubeconfigPath,
			"--config=" + stages,
			"--manage-all-nodes=true",
			"--node-lease-duration-seconds=" + strconv.Itoa(KwokLeaseDurationSeconds),
			"--server-address=127.0.0.1:" + strconv.Itoa(port), // /healthz only
		}
		args = append(args, cp.cfg.ExtraKwokArgs...)
		p, err := startProcess("kwok", filepath.Join(cp.cfg.BinDir, "kwok"), args, cp.LogDir)
		if err != nil {
			return nil, err
		}
		cp.kwok = p
		plain := &http.Client{Timeout: 2 * time.Second}
		return p, waitHealthy(p, 60*time.Second, func() (bool, string) {
			return httpOK(plain, "http://127.0.0.1:"+strconv.Itoa(port)+"/healthz", "")
		})
	})
}
