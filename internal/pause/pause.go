// Package pause waits for a duration or until a context ends, whichever
// comes first: the one wait behind retry backoffs, rate limits and the
// periodic loops (heartbeats, lease renewals, the activity monitor, the
// scheduler's tick), and Backoff, the one doubling wait between retries.
// It depends on nothing of ours.
package pause

import (
	"context"
	"time"
)

// For waits d or until ctx ends. It returns nil when d has passed, else the
// cause of ctx's end (context.Cause). A d of zero or less does not wait: it
// returns ctx's cause if ctx has ended already, else nil, so that a loop
//
//	for next := time.Duration(0); pause.For(ctx, next) == nil; next = interval {
//
// runs its first round at once and stops when ctx ends.
func For(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Backoff is the doubling wait between retries of a failing call: the
// first Next is Min, each later one twice the one before, at most Max;
// Reset (after a success) starts over at Min. Set Min and Max; the zero
// Backoff's waits are all zero.
type Backoff struct {
	// Min is the first wait, Max the longest.
	Min, Max time.Duration
	d        time.Duration
}

// Next returns the wait before the next retry (wait it with For) and
// doubles the one after it.
func (b *Backoff) Next() time.Duration {
	d := max(b.d, b.Min)
	b.d = min(2*d, b.Max)
	return d
}

// Reset makes the next wait Min again.
func (b *Backoff) Reset() { b.d = 0 }
