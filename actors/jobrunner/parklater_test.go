package jobrunner

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/dbupdates"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/replicate"
)

type nopWake struct{ c chan struct{} }

func (w nopWake) C() <-chan struct{} { return w.c }
func (w nopWake) Close()             {}

// TestParkLater: a job whose server's _db_updates could not be read keeps
// its feed, and asks again once the verdict expired
// (dbupdates.DefaultUnsupportedFor): the engine's ParkLater says no (and
// never blocks) until the wake-up source opened on its own goroutine, then
// yes; before the verdict expired it does not ask the source at all.
func TestParkLater(t *testing.T) {
	var opens atomic.Int32
	unsupported := atomic.Bool{}
	unsupported.Store(true)
	pk := &parker{log: zerolog.Nop(), p: &replicate.Params{}, o: &replicate.Options{},
		open: func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) {
			opens.Add(1)
			if unsupported.Load() {
				return nil, fmt.Errorf("probe: %w", dbupdates.ErrUnsupported)
			}
			return nopWake{c: make(chan struct{}, 1)}, nil
		}}
	ctx := context.Background()
	if pk.ensure(ctx) || pk.enabled() {
		t.Fatal("a source whose _db_updates is unsupported lets the job park")
	}
	later := pk.parkLater(ctx)
	if later() || opens.Load() != 1 {
		t.Fatalf("before the verdict expired: ParkLater true or the source opened again (%d opens)", opens.Load())
	}
	unsupported.Store(false)
	pk.mu.Lock()
	pk.offUntil = time.Now().Add(-time.Second) // the verdict expired
	pk.mu.Unlock()
	if later() {
		t.Fatal("ParkLater said yes before the wake-up source was opened")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !later() {
		if time.Now().After(deadline) {
			t.Fatalf("ParkLater still no after the verdict expired and the source works (%d opens)", opens.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !pk.enabled() {
		t.Error("the next run may not park although the wake-up source works")
	}
}
