package replicate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// TestRateLimiterAIMD walks one key through CouchDB's numbers
// (couch_replicator_rate_limiter.erl and its tests): a new key has interval
// 0; a failure gives round(max(I,20)*1.2); an update within 80 ms of the
// last is ignored; a success after more than a second first decays by 2*Δt;
// the additive step is 20/40/100/1000 ms above 0/100/1000/10000 ms; a
// result at or below zero forgets the key, anything else is floored at 20.
func TestRateLimiterAIMD(t *testing.T) {
	t.Parallel()
	type step struct {
		advance time.Duration
		op      string // "failure", "success" or "" (just read)
		want    time.Duration
	}
	ms := time.Millisecond
	tests := []struct {
		name  string
		start time.Duration // interval set up before the steps (0: none)
		steps []step
	}{
		{name: "first failures and the sensitivity window", steps: []step{
			{0, "", 0},
			{0, "success", 0}, // success on an unknown key inserts nothing
			{0, "failure", 24 * ms},
			{10 * ms, "failure", 24 * ms}, // within 80 ms: ignored
			{70 * ms, "failure", 24 * ms}, // exactly 80 ms: still ignored (=<)
			{1 * ms, "failure", 29 * ms},  // 28.8 rounds to 29
			{100 * ms, "failure", 35 * ms},
			{100 * ms, "success", 20 * ms}, // 35-20 = 15, floored at 20
			{50 * ms, "success", 20 * ms},  // within 80 ms: ignored
			{50 * ms, "success", 0},        // 20-20 = 0: forgotten
		}},
		{name: "additive steps by size", start: 20000 * ms, steps: []step{
			{100 * ms, "success", 19000 * ms}, // > 10000: -1000
			{100 * ms, "success", 18000 * ms},
		}},
		{name: "step 100 above a second", start: 1500 * ms, steps: []step{
			{100 * ms, "success", 1400 * ms},
		}},
		{name: "step 40 above 100 ms", start: 500 * ms, steps: []step{
			{100 * ms, "success", 460 * ms},
			{100 * ms, "success", 420 * ms},
		}},
		{name: "step 20 at 100 ms", start: 100 * ms, steps: []step{
			{100 * ms, "success", 80 * ms},
		}},
		{name: "time decay after a quiet second", start: 5000 * ms, steps: []step{
			{1500 * ms, "success", 1900 * ms}, // 5000-3000 = 2000, > 1000: -100
		}},
		{name: "no decay at exactly a second", start: 5000 * ms, steps: []step{
			{1000 * ms, "success", 4900 * ms},
		}},
		{name: "decay to zero forgets", start: 300 * ms, steps: []step{
			{5 * time.Second, "success", 0},
		}},
		{name: "failure caps at 25 s", start: 24000 * ms, steps: []step{
			{100 * ms, "failure", 25000 * ms}, // 28800 capped
			{100 * ms, "failure", 25000 * ms},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			now := time.Unix(1700000000, 0)
			l := NewRateLimiter(func() time.Time { return now })
			k := couch.LimitKey{Endpoint: "http://h/db/", Method: "POST"}
			if tt.start > 0 {
				l.entries[k] = rlEntry{ms: tt.start.Milliseconds(), updated: now}
			}
			for i, s := range tt.steps {
				now = now.Add(s.advance)
				switch s.op {
				case "failure":
					l.Failure(k)
				case "success":
					l.Success(k)
				}
				if got := l.Interval(k); got != s.want {
					t.Fatalf("step %d (%s after %v): interval %v, want %v", i, s.op, s.advance, got, s.want)
				}
			}
		})
	}
}

func TestRateLimiterKeysAreIndependent(t *testing.T) {
	t.Parallel()
	now := time.Unix(1700000000, 0)
	l := NewRateLimiter(func() time.Time { return now })
	post := couch.LimitKey{Endpoint: "http://h/db/", Method: "POST"}
	get := couch.LimitKey{Endpoint: "http://h/db/", Method: "GET"}
	other := couch.LimitKey{Endpoint: "http://h/other/", Method: "POST"}
	l.Failure(post)
	if got := l.Interval(get); got != 0 {
		t.Errorf("GET interval after a POST 429: %v", got)
	}
	if got := l.Interval(other); got != 0 {
		t.Errorf("other endpoint's interval: %v", got)
	}
	l.Failure(other)
	snap := l.Snapshot()
	if len(snap) != 2 || snap[0].Key != post || snap[1].Key != other || snap[0].Interval != 24*time.Millisecond {
		t.Fatalf("snapshot %+v", snap)
	}
	if n := l.Reset(&post); n != 1 || l.Interval(post) != 0 || l.Interval(other) == 0 {
		t.Errorf("Reset(post) = %d; post %v other %v", n, l.Interval(post), l.Interval(other))
	}
	if n := l.Reset(nil); n != 1 || len(l.Snapshot()) != 0 {
		t.Errorf("Reset(nil) = %d, left %v", n, l.Snapshot())
	}
}

func TestRateLimiterCleanup(t *testing.T) {
	t.Parallel()
	now := time.Unix(1700000000, 0)
	l := NewRateLimiter(func() time.Time { return now })
	old := couch.LimitKey{Endpoint: "http://h/a/", Method: "GET"}
	fresh := couch.LimitKey{Endpoint: "http://h/b/", Method: "GET"}
	l.Failure(old)
	now = now.Add(RateLimitMaxInterval)
	l.Failure(fresh)
	now = now.Add(time.Millisecond)
	if n := l.Cleanup(); n != 1 {
		t.Fatalf("Cleanup removed %d, want 1", n)
	}
	if l.Interval(old) != 0 || l.Interval(fresh) == 0 {
		t.Errorf("after cleanup: old %v fresh %v", l.Interval(old), l.Interval(fresh))
	}
}

func TestRateLimiterWait(t *testing.T) {
	t.Parallel()
	now := time.Unix(1700000000, 0)
	l := NewRateLimiter(func() time.Time { return now })
	k := couch.LimitKey{Endpoint: "http://h/db/", Method: "POST"}
	if err := l.Wait(context.Background(), k); err != nil {
		t.Fatalf("Wait on an unknown key: %v", err)
	}
	// A cancelled context ends the wait with its cause.
	l.entries[k] = rlEntry{ms: 20000, updated: now}
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("job stopped")
	cancel(cause)
	if err := l.Wait(ctx, k); !errors.Is(err, cause) {
		t.Errorf("Wait with a cancelled context: %v", err)
	}
	// At the maximum interval requests fail with max_backoff.
	l.entries[k] = rlEntry{ms: rlMaxMs, updated: now}
	if err := l.Wait(context.Background(), k); !errors.Is(err, ErrMaxBackoff) {
		t.Errorf("Wait at max interval: %v", err)
	}
}
