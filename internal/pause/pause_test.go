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
