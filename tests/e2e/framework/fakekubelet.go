package framework

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// fakeKubelet stands in for kube-scheduler and the kubelets of the lab
// nodes, for pods only, and only as far as the DaemonSet controller needs:
//
//   - It binds each unscheduled pod whose required node affinity names exactly
//     one node (what the DaemonSet controller gives every pod it creates) to
//     that node, like the scheduler would. This is not cosmetic: the
//     DaemonSet controller reacts to a Node label change only for pods it
//     finds on that node by spec.nodeName. With unbound pods, relabelling a
//     node away from an operand would leave desiredNumberScheduled stale
//     until the next full resync, hours later.
//   - It finishes the graceful deletion of pods bound to a node (a kubelet's
//     job once the containers are stopped), so a pod the controller removes
//     from a relabelled node really disappears.
//
// Pods never run and stay Pending; other pods (no single-node affinity) are
// left alone.
type fakeKubelet struct {
	client *http.Client
	server string
	log    *log.Logger
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

const fakeKubeletInterval = 200 * time.Millisecond

func startFakeKubelet(client *http.Client, server, logDir string) (*fakeKubelet, error) {
	f, err := os.OpenFile(filepath.Join(logDir, "fake-kubelet.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	fk := &fakeKubelet{client: client, server: server, log: log.New(f, "", log.LstdFlags|log.Lmicroseconds), cancel: cancel}
	fk.wg.Add(1)
	go func() {
		defer fk.wg.Done()
		defer f.Close()
		tick := time.NewTicker(fakeKubeletInterval)
		defer tick.Stop()
		for {
			if err := fk.reconcile(ctx); err != nil && ctx.Err() == nil {
				fk.log.Printf("reconcile: %v", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return fk, nil
}

func (fk *fakeKubelet) stop() {
	if fk == nil {
		return
	}
	fk.cancel()
	fk.wg.Wait()
}

// The few pod fields the fake kubelet looks at.
type podList struct {
	Items []pod `json:"items"`
}

type pod struct {
	Metadata struct {
		Name              string  `json:"name"`
		Namespace         string  `json:"namespace"`
		UID               string  `json:"uid"`
		DeletionTimestamp *string `json:"deletionTimestamp"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
		Affinity *struct {
			NodeAffinity *struct {
				Required *struct {
					Terms []struct {
						MatchFields []struct {
							Key      string   `json:"key"`
							Operator string   `json:"operator"`
							Values   []string `json:"values"`
						} `json:"matchFields"`
					} `json:"nodeSelectorTerms"`
				} `json:"requiredDuringSchedulingIgnoredDuringExecution"`
			} `json:"nodeAffinity"`
		} `json:"affinity"`
	} `json:"spec"`
}

// targetNode returns the single node the pod's required affinity pins it to.
func (p *pod) targetNode() (string, bool) {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.Required == nil || len(a.NodeAffinity.Required.Terms) != 1 {
		return "", false
	}
	node := ""
	for _, mf := range a.NodeAffinity.Required.Terms[0].MatchFields {
		if mf.Key == "metadata.name" && mf.Operator == "In" && len(mf.Values) == 1 {
			if node != "" && node != mf.Values[0] {
				return "", false
			}
			node = mf.Values[0]
		}
	}
	return node, node != ""
}

func (fk *fakeKubelet) reconcile(ctx context.Context) error {
	var pods podList
	// resourceVersion=0: served from the API server's watch cache.
	if err := fk.do(ctx, http.MethodGet, "/api/v1/pods?resourceVersion=0", nil, &pods); err != nil {
		return err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		ns, name := p.Metadata.Namespace, p.Metadata.Name
		podPath := "/api/v1/namespaces/" + url.PathEscape(ns) + "/pods/" + url.PathEscape(name)
		switch {
		case p.Metadata.DeletionTimestamp != nil && p.Spec.NodeName != "":
			// Precondition on UID: never delete a newer pod of the same name.
			body := map[string]any{"gracePeriodSeconds": 0, "preconditions": map[string]string{"uid": p.Metadata.UID}}
			if err := fk.do(ctx, http.MethodDelete, podPath, body, nil); err != nil {
				fk.log.Printf("finish deletion of %s/%s: %v", ns, name, err)
			} else {
				fk.log.Printf("deleted %s/%s from %s", ns, name, p.Spec.NodeName)
			}
		case p.Metadata.DeletionTimestamp == nil && p.Spec.NodeName == "":
			node, ok := p.targetNode()
			if !ok {
				continue
			}
			binding := map[string]any{
				"apiVersion": "v1", "kind": "Binding",
				"metadata": map[string]any{"name": name, "namespace": ns, "uid": p.Metadata.UID},
				"target":   map[string]string{"apiVersion": "v1", "kind": "Node", "name": node},
			}
			if err := fk.do(ctx, http.MethodPost, podPath+"/binding", binding, nil); err != nil {
				fk.log.Printf("bind %s/%s to %s: %v", ns, name, node, err)
			} else {
				fk.log.Printf("bound %s/%s to %s", ns, name, node)
			}
		}
	}
	return nil
}

func (fk *fakeKubelet) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, fk.server+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := fk.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}
