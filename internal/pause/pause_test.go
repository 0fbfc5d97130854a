package pause

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	t.Parallel()
	cause := errors.New("shutting down")
	ended, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		d    time.Duration
		want error
	}{
		{"zero, live ctx", context.Background(), 0, nil},
		{"negative, live ctx", context.Background(), -time.Second, nil},
		{"short, live ctx", context.Background(), time.Millisecond, nil},
		{"zero, ended ctx", ended, 0, cause},
		{"long, ended ctx", ended, time.Hour, cause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := For(tc.ctx, tc.d); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("For(%s) = %v, want %v", tc.d, err, tc.want)
			}
		})
	}
}

// TestForEndsWithCtx: a long wait returns the cause as soon as ctx ends.
func TestForEndsWithCtx(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- For(ctx, time.Hour) }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("For = %v, want context.Canceled", err)
	}
}

// TestBackoff: waits double from Min up to Max, and Reset starts over.
func TestBackoff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		min, max time.Duration
		want     []time.Duration // Next, Next, ...; 0 marks a Reset
	}{
		{"doubles to the cap", time.Second, 5 * time.Second, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}},
		{"reset", 100 * time.Millisecond, 10 * time.Second, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 0, 100 * time.Millisecond, 200 * time.Millisecond}},
		{"min above max", time.Second, time.Millisecond, []time.Duration{time.Second, time.Second}},
		{"zero", 0, 0, []time.Duration{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Backoff{Min: tc.min, Max: tc.max}
			for i, want := range tc.want {
				if want == 0 && tc.min != 0 {
					b.Reset()
					continue
				}
				if got := b.Next(); got != want {
					t.Fatalf("wait %d = %v, want %v", i+1, got, want)
				}
			}
		})
	}
}
