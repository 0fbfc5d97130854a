package sqlite

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// TestCheckpointsKeepWALBounded: with automatic checkpoints off, the
// checkpoint goroutine copies the WAL back and, past ckptRestartFrames,
// completes a checkpoint so that the WAL starts over instead of growing.
func TestCheckpointsKeepWALBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~40 MB of WAL frames")
	}
	db, path := openTemp(t, Options{})
	ctx := context.Background()
	value := bytes.Repeat([]byte("v"), 3000) // about a page per commit
	const rounds, perRound = 40, 2 * ckptEvery
	for r := range rounds {
		for i := range perRound {
			key := tuple.Tuple{"ckpt", (r*perRound + i) % 500}.Pack()
			if err := db.Transact(ctx, func(tx kv.Tx) error {
				tx.Set(key, value)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		// Each round kicked the checkpoint goroutine at least once; wait
		// for a checkpoint to finish before writing more.
		wait, cancel := context.WithTimeout(ctx, 30*time.Second)
		select {
		case <-db.ckptDone:
		case <-wait.Done():
			t.Fatal("no checkpoint after a round of commits")
		}
		cancel()
	}
	if db.ckptComplete.Load() == 0 {
		t.Fatalf("no checkpoint completed under the write lock in %d commits", rounds*perRound)
	}
	st, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	// Without restarts the WAL would hold every frame written (two or
	// more per commit: over 40 MB here).
	if limit := int64(2*ckptRestartFrames+4*perRound) * 4120; st.Size() > limit {
		t.Errorf("WAL is %d bytes after %d commits, want at most %d", st.Size(), rounds*perRound, limit)
	}
}
