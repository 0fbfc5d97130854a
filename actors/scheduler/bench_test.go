package scheduler_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
)

// BenchmarkSchedulerInterval is the store work of one scheduler interval
// (what the actor's tick does: expired transient cleanup, the bounded
// pending count, Rotate over max_jobs running jobs) with 1,000 / 10,000 /
// 100,000 pending jobs in a real sqlite store. It must stay flat.
func BenchmarkSchedulerInterval(b *testing.B) {
	for _, pending := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("pending=%d", pending), func(b *testing.B) {
			ctx := context.Background()
			db, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "s.db"), sqlite.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			q := jobqueue.New(db, jobqueue.Options{NodeName: "n1"})
			p := schedpolicy.DefaultPolicy()
			store := repjob.New(q, db, repjob.Options{ServerUUID: "u", Policy: p})
			if err := store.Init(ctx); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < pending; i += 1000 {
				err := db.Transact(ctx, func(tx kv.Tx) error {
					for j := i; j < i+1000 && j < pending; j++ {
						if err := q.AddTx(tx, repjob.JobType, fmt.Sprintf("job-%07d", j),
							jobqueue.AddOptions{Priority: uint64(j), Data: []byte{}}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			now := time.Now()
			running := make([]schedpolicy.RunningJob, p.MaxJobs)
			for i := range running {
				running[i] = schedpolicy.RunningJob{ID: fmt.Sprint(i), Continuous: i%5 != 0, Started: now.Add(-time.Duration(i) * time.Second)}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := store.CleanupTransient(ctx); err != nil {
					b.Fatal(err)
				}
				n, err := store.PendingCount(ctx, p.MaxJobs+p.MaxChurn)
				if err != nil {
					b.Fatal(err)
				}
				d := schedpolicy.Rotate(running, n, p, now)
				if len(d.Stop) != p.MaxChurn {
					b.Fatalf("stopped %d", len(d.Stop))
				}
			}
		})
	}
}
