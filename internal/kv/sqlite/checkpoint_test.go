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
	if db.ckptComplete.Load() == 0 {
		t.Fatalf("no checkpoint completed under the write lock in %d commits", n)
	}
	st, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	if limit := int64(8*target) * 4120; st.Size() > limit {
		t.Errorf("WAL is %d bytes after %d commits, want at most %d", st.Size(), n, limit)
	}
}
