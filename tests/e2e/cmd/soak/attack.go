package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// attackKinds: issue 21's hostile bodies, and bodies of many tiny labels or groups.
// review builds a Node review with these labels.
func attackKinds(review func(string, map[string]string) []byte) []kind {
	nel := strings.Repeat("\u0085", 1_700_000)
	withField := func(set func(req map[string]any)) []byte {
		var v map[string]any
		_ = json.Unmarshal(review("n", map[string]string{"nvidia.com/gpu.deploy.dcgm": "true"}), &v)
		set(v["request"].(map[string]any))
		b, _ := json.Marshal(v)
		return b
	}
	unknown := map[string]string{}
	for i := 0; i < 80_000; i++ {
		unknown[fmt.Sprintf("nvidia.com/gpu.deploy.u%d", i)] = "true"
	}
	// About 3 MB each: many tiny labels, many tiny groups (each read where it lies, not copied).
	tiny := map[string]string{}
	for i := 0; i < 250_000; i++ {
		tiny[fmt.Sprintf("k%d", i)] = ""
	}
	groups := make([]string, 300_000)
	for i := range groups {
		groups[i] = fmt.Sprintf("g%d", i)
	}
	spec := map[string]any{"toolkit": map[string]any{"enabled": true}}
	for i := 0; i < 150_000; i++ {
		spec[fmt.Sprintf("k%d", i)] = map[string]any{"a": i}
	}
	policy := func(spec any) map[string]any {
		return map[string]any{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
			"metadata": map[string]any{"name": "cluster-policy"}, "spec": spec}
	}
	policyReview, _ := json.Marshal(map[string]any{
		"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{
			"uid":       "soak-policy",
			"kind":      map[string]string{"group": "nvidia.com", "version": "v1", "kind": "ClusterPolicy"},
			"name":      "cluster-policy",
			"operation": "UPDATE",
			"userInfo":  map[string]any{"username": "soak"},
			"object":    policy(spec),
			"oldObject": policy(map[string]any{}),
		},
	})
	return []kind{
		{name: "nel-dry-run", body: withField(func(r map[string]any) { r["dryRun"] = nel }), statuses: []int{400}},
		{name: "nel-groups", body: withField(func(r map[string]any) { r["userInfo"] = map[string]any{"groups": nel} }), statuses: []int{400}},
		{name: "250k-tiny-labels", body: review("n", tiny), statuses: []int{200}},
		{name: "300k-groups", body: withField(func(r map[string]any) { r["userInfo"] = map[string]any{"username": "soak", "groups": groups} }), statuses: []int{200}},
		{name: "80k-unknown-keys", body: review("n", unknown), statuses: []int{200}},
		{name: "policy-150k-fields", body: policyReview, path: "/validate/gpu-policy", statuses: []int{200}},
	}
}

// attackerDialer dials from the attackers' source address.
func attackerDialer() *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: attackerIP}, Timeout: 5 * time.Second}
}

// keep runs n copies of f, each started again 100 ms after it returns, until ctx ends.
func keep(ctx context.Context, n int, f func(context.Context)) {
	for i := 0; i < n; i++ {
		go func() {
			for ctx.Err() == nil {
				f(ctx)
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
	}
}

// attackConnections holds, from 127.0.0.9: 300 silent TCP connections, 100 idle HTTP/2
// connections that answer PINGs, 40 idle keep-alive connections to the admin port, 8 HTTP/2
// streams a second that declare a 3.5 MiB body and send none; with shares, also 300 HTTP/2
// connections that each keep one request in progress (its first byte sent, never the rest),
// and 8 bodies that send 1 MiB each and then stall, holding what they can of the body budget.
// Each reconnects when closed.
func attackConnections(ctx context.Context, port, admin int, ca *authority, shares bool) {
	webhook := fmt.Sprintf("127.0.0.1:%d", port)
	adminAddr := fmt.Sprintf("127.0.0.1:%d", admin)
	silent := func(addr string) func(context.Context) {
		return func(ctx context.Context) {
			conn, err := attackerDialer().DialContext(ctx, "tcp", addr)
			if err != nil {
				return
			}
			defer conn.Close()
			go func() { <-ctx.Done(); conn.Close() }()
			_, _ = io.Copy(io.Discard, conn) // until the server closes it
		}
	}
	keep(ctx, 300, silent(webhook))

	h2 := func() *http.Client {
		tr := &http.Transport{
			TLSClientConfig:   ca.tlsConfig(nil),
			ForceAttemptHTTP2: true,
			DialContext:       attackerDialer().DialContext,
			IdleConnTimeout:   time.Hour,
		}
		return &http.Client{Transport: tr, Timeout: 30 * time.Second}
	}
	keep(ctx, 100, func(ctx context.Context) {
		client := h2()
		defer client.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+webhook+"/idle", nil)
		resp, err := client.Do(req)
		if err != nil {
			return
		}
		resp.Body.Close()
		// Idle, answering PINGs, until the server closes it: then the next request fails.
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+webhook+"/idle", nil)
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			resp.Body.Close()
		}
	})

	keep(ctx, 40, func(ctx context.Context) {
		conn, err := attackerDialer().DialContext(ctx, "tcp", adminAddr)
		if err != nil {
			return
		}
		defer conn.Close()
		go func() { <-ctx.Done(); conn.Close() }()
		_, _ = conn.Write([]byte("GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"))
		_, _ = io.Copy(io.Discard, conn) // kept alive, idle, until the server closes it
	})

	// stalled posts a body that declares 3.5 MiB, sends prefix (maybe nothing) and then nothing
	// more until the request ends.
	stalled := func(client *http.Client, ctx context.Context, prefix []byte) {
		body, w := io.Pipe()
		defer w.Close()
		if len(prefix) > 0 {
			go func() { _, _ = w.Write(prefix) }()
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+webhook+"/validate", body)
		req.ContentLength = 3_670_016
		req.Header.Set("Content-Type", "application/json")
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	if shares {
		keep(ctx, 300, func(ctx context.Context) {
			client := h2()
			defer client.CloseIdleConnections()
			stalled(client, ctx, []byte("{"))
		})
		megabyte := bytes.Repeat([]byte(" "), 1<<20)
		keep(ctx, 8, func(ctx context.Context) {
			client := h2()
			defer client.CloseIdleConnections()
			stalled(client, ctx, megabyte)
		})
	}

	go func() {
		client := h2()
		tick := time.NewTicker(time.Second / 8)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			go stalled(client, ctx, nil)
		}
	}()
}

type probeTally struct {
	sent, failed atomic.Int64
	firstFailure atomic.Value
}

func (p *probeTally) first() string {
	s, _ := p.firstFailure.Load().(string)
	return s
}

// probe asks /livez and /readyz every second, with the kubelet's one-second timeout, from the
// good source.
func probe(ctx context.Context, adminURL string, t *probeTally) {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, path := range []string{"/livez", "/readyz"} {
			t.sent.Add(1)
			resp, err := client.Get(adminURL + path)
			if err == nil {
				resp.Body.Close()
			}
			if err != nil || resp.StatusCode != 200 {
				t.failed.Add(1)
				what := fmt.Sprint(err)
				if err == nil {
					what = resp.Status
				}
				t.firstFailure.CompareAndSwap(nil, path+": "+what)
			}
		}
	}
}
