package dbupdates

import "testing"

// TestWatchOnSignal: a watch with OnSignal calls the function at every
// signal, besides signalling C (coalesced); OnSignal(nil) stops the calls.
func TestWatchOnSignal(t *testing.T) {
	w := &Watch{c: make(chan struct{}, 1)}
	calls := 0
	w.OnSignal(func() { calls++ })
	w.signal()
	w.signal()
	if calls != 2 || len(w.c) != 1 {
		t.Fatalf("after two signals: %d calls, %d signals waiting; want 2 and 1", calls, len(w.c))
	}
	w.OnSignal(nil)
	w.signal()
	if calls != 2 {
		t.Fatalf("called after OnSignal(nil): %d calls", calls)
	}
}
