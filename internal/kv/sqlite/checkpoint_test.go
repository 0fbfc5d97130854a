package sqlite

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// TestCheckpointsKeepWALBounded: with automatic checkpoints off, the
// checkpoint goroutine copies the WAL back and, past twice its target,
// completes a checkpoint so that the WAL starts over instead of growing.
// The bound is in commits, whatever the machine's speed or load: the
// leader waits for a checkpoint goroutine that falls two intervals behind
// (kickCheckpoint). Run it with both CPUs busy to see it hold.
func TestCheckpointsKeepWALBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes some 66 MB of WAL frames")
	}
	const target = 500 // frames; ckptTargetFrames is much larger
	db, path := openTemp(t, Options{ckptFrames: target})
	ctx := context.Background()
	value := bytes.Repeat([]byte("v"), 100)
	// Each commit writes at least two pages (a kv leaf and the commit
	// counter): without restarts the WAL would pass 32 * target frames
	// (66 MB).
	const commits = 16 * target
	n := 0
	for rounds := 0; rounds < 3 || n < commits; rounds++ {
		// Commit until the checkpoint goroutine (kicked every
		// db.ckptEvery commits) reports a checkpoint, so that a slow
		// machine does not outrun it.
		for done := false; !done; {
			key := tuple.Tuple{"ckpt", n % 500}.Pack()
			if err := db.Transact(ctx, func(tx kv.Tx) error {
				tx.Set(key, value)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			n++
			select {
			case <-db.ckptDone:
				done = true
			default:
			}
		}
	}
	// Whether a pass had to complete under the write lock depends on how
	// the writer and the checkpoint goroutine interleave (a passive pass
	// that no write overlaps already lets the WAL start over); the bound
	// below holds either way, and fails if neither restarts the WAL.
	st, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d commits, %d checkpoints completed under the write lock, WAL %d bytes", n, db.ckptComplete.Load(), st.Size())
	if limit := int64(8*target) * 4120; st.Size() > limit {
		t.Errorf("WAL is %d bytes after %d commits, want at most %d", st.Size(), n, limit)
	}
}
