package replication

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// Values from couch_replicator_rate_limiter_tests (apache/couchdb): a new key
// has interval 0; one failure gives 24 ms; a second failure inside the 80 ms
// sensitivity window is ignored; one 100 ms later gives 28.8 (CouchDB
// rounds to 29); successes step the interval back down to 0.
func TestRateLimiterAIMD(t *testing.T) {
	now := time.Unix(0, 0)
	l := newRateLimiter(func() time.Time { return now })
	k := couch.LimitKey{Endpoint: "http://h/db/", Method: "POST"}
	interval := func() time.Duration {
		if e, ok := l.entries[k]; ok {
			return e.interval
		}
		return 0
	}
	steps := []struct {
		advance time.Duration
		op      string
		want    time.Duration
	}{
		{0, "", 0},
		{0, "failure", 24 * time.Millisecond},
		{10 * time.Millisecond, "failure", 24 * time.Millisecond}, // inside the window
		{100 * time.Millisecond, "failure", 28800 * time.Microsecond},
		{100 * time.Millisecond, "success", 20 * time.Millisecond}, // 28.8-20 = 8.8, floored at 20
		{100 * time.Millisecond, "success", 0},                     // 20-20 = 0: entry removed
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		switch s.op {
		case "failure":
			l.Failure(k)
		case "success":
			l.Success(k)
		}
		if got := interval(); got != s.want {
			t.Fatalf("step %d (%s): interval %v, want %v", i, s.op, interval(), s.want)
		}
	}
	// At the maximum interval requests fail with max_backoff.
	l.entries[k] = &rlEntry{interval: rlMaxInterval, updated: now}
	if err := l.Wait(context.Background(), k); !errors.Is(err, ErrMaxBackoff) {
		t.Errorf("Wait at max interval: %v", err)
	}
}
