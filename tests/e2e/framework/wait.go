package framework

import (
	"fmt"
	"testing"
	"time"
)

// PollInterval is how often WaitFor and Poll re-check a condition during
// their first PollSteadyFor.
var PollInterval = 200 * time.Millisecond

// PollSteadyFor is how long Poll re-checks every PollInterval. A condition
// still false then waits on a controller's pace (a DaemonSet rollout, an
// operator's reconciles), and each check costs a kubectl process and API
// requests, CPU that the other jobs of a parallel run share: from there the
// interval grows by half at each check, up to PollMaxInterval. (Waits whose
// duration a test bounds, a Lease taken over in about 6 s, are checked at
// PollInterval up to here and at most a few hundred ms later after it.)
var PollSteadyFor = 5 * time.Second

// PollMaxInterval bounds the interval between two checks of Poll.
var PollMaxInterval = time.Second

// Poll calls cond until it returns true or timeout passes. cond's status
// string describes the state it saw; the last one is returned in the error.
func Poll(timeout time.Duration, cond func() (done bool, status string)) error {
	start := time.Now()
	deadline := start.Add(timeout)
	interval := PollInterval
	for {
		done, status := cond()
		if done {
			return nil
		}
		now := time.Now()
		if now.After(deadline) {
			return fmt.Errorf("timed out after %s; last state: %s", timeout, status)
		}
		if now.Sub(start) >= PollSteadyFor {
			interval = min(interval*3/2, max(PollMaxInterval, PollInterval))
		}
		time.Sleep(interval)
	}
}

// WaitFor is Poll that fails the test (t.Fatalf) on timeout, naming what it
// waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (done bool, status string)) {
	t.Helper()
	start := time.Now()
	if err := Poll(timeout, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	t.Logf("%s: after %s", what, time.Since(start).Round(time.Millisecond))
}
