package schedpolicy_test

import (
	"fmt"
	"testing"

	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/internal/share"
)

// BenchmarkInterval is one rescheduling interval of a node with the default
// policy (max_jobs 500, max_churn 20) and 100 _replicator databases: charge
// the 500 running jobs, rotate, resubmit the 20 stopped jobs with their new
// fair-share deadlines into the in-memory queue and accept 20 pending ones.
// The cost must not grow with the number of pending jobs.
func BenchmarkInterval(b *testing.B) {
	for _, pending := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("pending=%d", pending), func(b *testing.B) {
			p := schedpolicy.DefaultPolicy()
			s := newSim(b, 1, p, share.Params{Quantum: p.RunQuantum()})
			const keys = 100
			for k := range keys {
				s.ledger.SetShares(fmt.Sprintf("db%03d/_replicator", k), 1+k*10)
				s.addJobs(fmt.Sprintf("db%03d/_replicator", k), (pending+p.MaxJobs)/keys)
			}
			s.fill(0, p.MaxJobs)
			s.tick(0) // warm
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				s.advance(p.Interval)
				s.tick(0)
			}
			b.StopTimer()
			if s.nodes[0].NumRunning() != p.MaxJobs {
				b.Fatalf("running %d, want %d", s.nodes[0].NumRunning(), p.MaxJobs)
			}
		})
	}
}
