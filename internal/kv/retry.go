package kv

import (
	"context"
	"math/rand/v2"
	"time"
)

// RetryBackoff is the wait of a backend's retry loop before running a
// conflicted transaction again: none before the first retry (the conflict
// is resolved already), then about 0.1ms·2^attempt, jittered and capped
// at 20ms; it returns early with ctx's error when ctx ends.
func RetryBackoff(ctx context.Context, attempt int) error {
	if attempt == 0 {
		return nil
	}
	d := 100 * time.Microsecond << min(attempt, 8)
	d = min(d, 20*time.Millisecond)
	d = d/2 + rand.N(d/2+1)
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
