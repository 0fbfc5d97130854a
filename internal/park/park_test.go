package park

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestJitter(t *testing.T) {
	const p = time.Minute
	for range 1000 {
		if d := Jitter(p); d < p/2 || d >= 3*p/2 {
			t.Fatalf("Jitter(%v) = %v, outside [%v, %v)", p, d, p/2, 3*p/2)
		}
	}
	if d := Jitter(0); d != 0 {
		t.Fatalf("Jitter(0) = %v", d)
	}
}

// TestRechecksPace: n waits on a pacer of r a second are spread over at
// least (n-1)/r (time cannot pass faster, so this bound never fails by
// chance); a nil pacer never waits; a done context ends a wait with its
// error.
func TestRechecksPace(t *testing.T) {
	r := NewRechecks(200)
	start := time.Now()
	for range 11 {
		if err := r.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Fatalf("11 rechecks at 200 a second in %v, want at least 50 ms", took)
	}
	var none *Rechecks
	if err := none.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	slow := NewRechecks(0.001) // one every 1,000 s
	_ = slow.Wait(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := slow.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with a canceled context: %v", err)
	}
}

type erring struct{ err error }

func (erring) C() <-chan struct{} { return nil }
func (erring) Close()             {}
func (e erring) Err() error       { return e.err }

type plain struct{}

func (plain) C() <-chan struct{} { return nil }
func (plain) Close()             {}

func TestErr(t *testing.T) {
	boom := errors.New("boom")
	if Err(erring{boom}) != boom || Err(erring{}) != nil || Err(plain{}) != nil {
		t.Fatal("Err does not report a source's Err, or invents one")
	}
}
