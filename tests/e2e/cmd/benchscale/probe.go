package main

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// probe sends one node AdmissionReview to a replica every interval until
// stopped, over one kept-alive TLS connection as the API server does, and
// keeps each answer's latency: what a node review costs on a replica while
// its audit works (the custom-resource flood changes the facts and so
// re-runs the auditor's pass over the whole fleet, again and again).
type probe struct {
	url    string
	body   []byte
	client *http.Client
	stop   chan struct{}
	done   sync.WaitGroup
	mu     sync.Mutex
	lat    []time.Duration
	errs   int
}

// reviewStats are one probe's figures.
type reviewStats struct {
	Reviews int     `json:"reviews"`
	Errors  int     `json:"errors"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
}

func startProbe(url string, body []byte, every time.Duration) *probe {
	p := &probe{
		url:  url,
		body: body,
		client: &http.Client{
			Timeout: 10 * time.Second,
			Transport: &http.Transport{
				// The replicas' certificates are the bench's own: what is
				// measured is the answer's time, not the chain.
				TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, //nolint:gosec
				MaxIdleConnsPerHost: 1,
			},
		},
		stop: make(chan struct{}),
	}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
				p.once()
			}
		}
	}()
	return p
}

func (p *probe) once() {
	start := time.Now()
	resp, err := p.client.Post(p.url, "application/json", bytes.NewReader(p.body))
	ok := err == nil
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ok = resp.StatusCode == http.StatusOK
	}
	took := time.Since(start)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !ok {
		p.errs++
		return
	}
	p.lat = append(p.lat, took)
}

// finish stops the probe and returns its figures.
func (p *probe) finish() reviewStats {
	close(p.stop)
	p.done.Wait()
	p.client.CloseIdleConnections()
	p.mu.Lock()
	defer p.mu.Unlock()
	s := reviewStats{Reviews: len(p.lat), Errors: p.errs}
	if len(p.lat) == 0 {
		return s
	}
	sorted := slices.Clone(p.lat)
	slices.Sort(sorted)
	at := func(q float64) float64 {
		i := int(q * float64(len(sorted)-1))
		return float64(sorted[i].Microseconds()) / 1000
	}
	s.P50Ms, s.P99Ms, s.MaxMs = at(0.50), at(0.99), float64(sorted[len(sorted)-1].Microseconds())/1000
	return s
}
