package framework

import (
	"fmt"
	"testing"
	"time"
)

// PollInterval is how often WaitFor and Poll re-check a condition.
var PollInterval = 200 * time.Millisecond

// Poll calls cond until it returns true or timeout passes. cond's status
// string describes the state it saw; the last one is returned in the error.
func Poll(timeout time.Duration, cond func() (done bool, status string)) error {
	deadline := time.Now().Add(timeout)
	for {
		done, status := cond()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s; last state: %s", timeout, status)
		}
		time.Sleep(PollInterval)
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
