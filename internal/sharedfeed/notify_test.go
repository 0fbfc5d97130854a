package sharedfeed

import "testing"

// TestWatchOnSignal: a watch with OnSignal calls the function at every
// signal, besides signalling C (coalesced); OnSignal(nil) stops the calls.
func TestWatchOnSignal(t *testing.T) {
	w := &Watch{s: &Subscription{wake: make(chan struct{}, 1), watch: true}}
	calls := 0
	w.OnSignal(func() { calls++ })
	w.s.signal()
	w.s.signal()
	if calls != 2 || len(w.C()) != 1 {
		t.Fatalf("after two signals: %d calls, %d signals waiting; want 2 and 1", calls, len(w.C()))
	}
	w.OnSignal(nil)
	w.s.signal()
	if calls != 2 {
		t.Fatalf("called after OnSignal(nil): %d calls", calls)
	}
}
