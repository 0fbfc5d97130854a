package sqlite

import (
	"context"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvtest"
)

// TestWatchPollBacksOff: with watches armed and nothing changing, each poll
// doubles the interval up to MaxPollInterval; a commit by another process
// fires the watch on its key and brings the interval back to PollInterval.
// It asserts the intervals the poller chose, never elapsed time.
func TestWatchPollBacksOff(t *testing.T) {
	const minI, maxI = time.Millisecond, 8 * time.Millisecond
	db, path := openTemp(t, Options{PollInterval: minI, MaxPollInterval: maxI})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	intervals := make(chan time.Duration, 1024)
	db.watches.mu.Lock()
	db.watches.pollHook = func(d time.Duration) {
		select {
		case intervals <- d:
		case <-ctx.Done():
		}
	}
	db.watches.mu.Unlock()
	defer cancel() // unblocks the hook before Close

	var wA, wB kv.Watch
	if err := db.Transact(ctx, func(tx kv.Tx) error {
		wA, wB = tx.Watch(keyA), tx.Watch(keyB)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	defer wA.Cancel()
	defer wB.Cancel()
	next := func() time.Duration {
		t.Helper()
		select {
		case d := <-intervals:
			return d
		case <-ctx.Done():
			t.Fatal("no poll within a minute")
			return 0
		}
	}
	// Backing off: 1, 2, 4, 8, 8, 8 ms (a poll may repeat the minimum
	// while arming settles, so skip leading minimums).
	d := next()
	for d == minI {
		d = next()
	}
	for _, want := range []time.Duration{2 * minI, 4 * minI, maxI, maxI, maxI} {
		if d != want {
			t.Fatalf("poll interval %v, want %v", d, want)
		}
		d = next()
	}
	if d != maxI {
		t.Fatalf("poll interval %v after backing off, want %v", d, maxI)
	}

	// Another process writes keyB: its watch fires and the poll interval
	// goes back to the minimum (nothing local commits or arms meanwhile).
	kvtest.StartChild(t, "bump", path).Wait(t)
	if err := wB.Wait(ctx); err != nil {
		t.Fatalf("watch on keyB: %v", err)
	}
	for d = next(); d == maxI; d = next() {
	}
	if d != minI {
		t.Fatalf("poll interval %v after a foreign change, want %v", d, minI)
	}
	select {
	case <-waitDone(wA):
		t.Fatal("watch on unchanged keyA fired")
	default:
	}
}

func waitDone(w kv.Watch) <-chan struct{} { return w.(*watch).fired }

// TestWatchPollQuietBound: once no other process has committed for
// QuietAfter, the poll backs off to QuietMaxPollInterval instead of
// MaxPollInterval; a foreign commit still brings it back to PollInterval.
// It asserts the intervals the poller chose, never elapsed time.
func TestWatchPollQuietBound(t *testing.T) {
	const minI, maxI, quietI = time.Millisecond, 4 * time.Millisecond, 16 * time.Millisecond
	db, path := openTemp(t, Options{PollInterval: minI, MaxPollInterval: maxI, QuietMaxPollInterval: quietI, QuietAfter: time.Nanosecond})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	intervals := make(chan time.Duration, 1024)
	db.watches.mu.Lock()
	db.watches.pollHook = func(d time.Duration) {
		select {
		case intervals <- d:
		case <-ctx.Done():
		}
	}
	db.watches.mu.Unlock()
	defer cancel() // unblocks the hook before Close

	var w, stays kv.Watch // stays keeps the poll going after w fired
	if err := db.Transact(ctx, func(tx kv.Tx) error { w, stays = tx.Watch(keyB), tx.Watch(keyA); return nil }); err != nil {
		t.Fatal(err)
	}
	defer w.Cancel()
	defer stays.Cancel()
	next := func() time.Duration {
		t.Helper()
		select {
		case d := <-intervals:
			return d
		case <-ctx.Done():
			t.Fatal("no poll within a minute")
			return 0
		}
	}
	backsOff := func(what string) {
		t.Helper()
		d := next()
		for d == minI {
			d = next()
		}
		for _, want := range []time.Duration{2 * minI, maxI, 2 * maxI, quietI, quietI} {
			if d != want {
				t.Fatalf("%s: poll interval %v, want %v", what, d, want)
			}
			d = next()
		}
	}
	backsOff("quiet from the start")
	kvtest.StartChild(t, "bump", path).Wait(t)
	if err := w.Wait(ctx); err != nil {
		t.Fatalf("watch on keyB: %v", err)
	}
	d := next()
	for d == quietI {
		d = next()
	}
	if d != minI {
		t.Fatalf("poll interval %v after a foreign change, want %v", d, minI)
	}
}
