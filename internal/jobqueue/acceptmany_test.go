package jobqueue

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv/storetest"
)

// TestAcceptMany: one AcceptMany takes up to n pending jobs, each running
// under its own lock and held under the lease (the lease records agree
// with the job records), skips stale entries, takes no more than what is
// pending, then waits or reports ErrNotFound; a batch starts within
// AcceptSpread of the head (the head itself with AcceptSpread 1); two nodes taking batches at
// once take every job exactly once; the jobs it took work as Accept's do
// (Finish), and a dead lease makes it fail with ErrLeaseLost.
func TestAcceptMany(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{RunLog: true})
		for i := range 50 {
			mustAdd(t, b, fmt.Sprintf("j%02d", i), AddOptions{Priority: uint64(i)})
		}
		// A stale entry: a job removed after it was queued is skipped.
		if err := b.q.Remove(b.ctx, typA, "j03"); err != nil {
			t.Fatal(err)
		}
		l, err := b.q.OpenLease(b.ctx, typA)
		if err != nil {
			t.Fatal(err)
		}
		taken := map[string]*Job{}
		take := func(jobs []*Job) {
			t.Helper()
			for _, j := range jobs {
				if _, dup := taken[j.ID()]; dup {
					t.Fatalf("job %s taken twice", j.ID())
				}
				if j.Info().State != StateRunning || len(j.Lock()) != lockLength || j.lease != l {
					t.Fatalf("job %s taken as %v, lock %x, lease %v", j.ID(), j.Info().State, j.Lock(), j.lease)
				}
				taken[j.ID()] = j
			}
		}
		jobs, err := b.q.AcceptMany(b.ctx, typA, 10, AcceptOptions{Lease: l})
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) != 10 {
			t.Fatalf("took %d jobs, want 10", len(jobs))
		}
		// The batch starts among the first AcceptSpread (16) pending jobs:
		// none of it lies beyond j26 (j03 was removed).
		for _, j := range jobs {
			if j.ID() > "j26" {
				t.Fatalf("batch %v: %s is more than AcceptSpread jobs past the head", ids(jobs), j.ID())
			}
		}
		take(jobs)
		jobs, err = b.q.AcceptMany(b.ctx, typA, 100, AcceptOptions{Lease: l, Wait: true})
		if err != nil {
			t.Fatal(err)
		}
		take(jobs)
		if len(taken) != 49 {
			t.Fatalf("took %d jobs in all, want the 49 pending", len(taken))
		}
		if _, ok := taken["j03"]; ok {
			t.Fatal("took the removed job")
		}
		if _, err := b.q.AcceptMany(b.ctx, typA, 5, AcceptOptions{Lease: l}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("accept with nothing pending: %v, want ErrNotFound", err)
		}
		leases, err := b.q.Leases(b.ctx, typA)
		if err != nil {
			t.Fatal(err)
		}
		if len(leases) != 1 || len(leases[0].Jobs) != 49 {
			t.Fatalf("leases %+v, want one holding 49 jobs", leases)
		}
		for id, j := range taken {
			mustState(t, b, id, StateRunning)
			if err := j.Finish(b.ctx, nil); err != nil {
				t.Fatalf("finish %s: %v", id, err)
			}
		}
		if leases, err := b.q.Leases(b.ctx, typA); err != nil || len(leases) != 1 || len(leases[0].Jobs) != 0 {
			t.Fatalf("after the finishes: leases %+v (%v), want one holding none", leases, err)
		}

		// Two nodes take 300 jobs in batches at once: each exactly once.
		for i := range 300 {
			mustAdd(t, b, fmt.Sprintf("k%03d", i), AddOptions{})
		}
		nodes := []*Queue{New(b.db, Options{NodeName: "n1", Clock: b.clock.Now, RunLog: true}),
			New(b.db, Options{NodeName: "n2", Clock: b.clock.Now, RunLog: true})}
		var (
			mu  sync.Mutex
			got = map[string]string{}
			wg  sync.WaitGroup
		)
		for _, q := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				nl, err := q.OpenLease(b.ctx, typA)
				if err != nil {
					t.Error(err)
					return
				}
				for {
					jobs, err := q.AcceptMany(b.ctx, typA, 32, AcceptOptions{Lease: nl})
					if errors.Is(err, ErrNotFound) {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					for _, j := range jobs {
						if other, dup := got[j.ID()]; dup {
							t.Errorf("job %s taken by %s and by %s", j.ID(), other, q.node)
						}
						got[j.ID()] = q.node
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(got) != 300 {
			t.Fatalf("the two nodes took %d jobs, want 300", len(got))
		}
		if _, err := b.q.Leases(b.ctx, typA); err != nil {
			t.Fatal(err)
		}
		runs, err := b.q.Runs(b.ctx, typA)
		if err != nil {
			t.Fatal(err)
		}
		for id, node := range got {
			if rs := runs[id]; len(rs) != 1 || rs[0].Node != node {
				t.Fatalf("job %s: runs %+v, want one on %s", id, rs, node)
			}
		}

		// With AcceptSpread 1 the batch is the head, in priority order.
		strict := New(b.db, Options{NodeName: "n3", Clock: b.clock.Now, AcceptSpread: 1})
		for i := range 40 {
			mustAdd(t, b, fmt.Sprintf("s%02d", i), AddOptions{Priority: uint64(i)})
		}
		for round := range 4 {
			jobs, err := strict.AcceptMany(b.ctx, typA, 5, AcceptOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for i := range 5 {
				want = append(want, fmt.Sprintf("s%02d", 5*round+i))
			}
			if got := ids(jobs); !slices.Equal(got, want) {
				t.Fatalf("AcceptSpread 1, batch %d: %v, want the head %v", round, got, want)
			}
		}

		// A lease the monitor found dead takes nothing.
		mustAdd(t, b, "late", AddOptions{})
		m := b.q.NewMonitor(MonitorOptions{})
		for k := range 3 {
			if _, err := m.Check(b.ctx, time.Now().Add(time.Duration(k)*2*time.Minute)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.q.AcceptMany(b.ctx, typA, 4, AcceptOptions{Lease: l}); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("accept under an expired lease: %v, want ErrLeaseLost", err)
		}
	})
}

func ids(jobs []*Job) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.ID()
	}
	return out
}

// TestAcceptManyShare: AcceptMany asks Share with the pending jobs it sees
// and takes at most the share; a share of 0 takes nothing (ErrOverShare,
// also with Wait) and leaves the jobs pending, unless the pending jobs fill
// the window AcceptMany reads; no Share takes the batch.
func TestAcceptManyShare(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		for i := range 30 {
			mustAdd(t, b, fmt.Sprintf("j%02d", i), AddOptions{Priority: uint64(i)})
		}
		var asked []int
		third := func(pending int) int { asked = append(asked, pending); return (pending + 2) / 3 }
		jobs, err := b.q.AcceptMany(b.ctx, typA, 64, AcceptOptions{Share: third})
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) != 10 || asked[len(asked)-1] != 30 {
			t.Fatalf("took %d jobs, Share asked with %v; want 10 of 30 pending", len(jobs), asked)
		}
		for _, wait := range []bool{false, true} {
			_, err = b.q.AcceptMany(b.ctx, typA, 64, AcceptOptions{Wait: wait, Share: func(int) int { return 0 }})
			if !errors.Is(err, ErrOverShare) {
				t.Fatalf("share 0 (wait %v): %v, want ErrOverShare", wait, err)
			}
		}
		// AcceptMany of 2 reads a window of 32 keys: 20 pending do not
		// fill it, Share bounds the batch.
		if _, err := b.q.AcceptMany(b.ctx, typA, 2, AcceptOptions{Share: func(int) int { return 0 }}); !errors.Is(err, ErrOverShare) {
			t.Fatalf("share 0, 20 pending, window 32: %v, want ErrOverShare", err)
		}
		// 40 pending fill the window: no bound (the count is only a
		// floor).
		for i := range 20 {
			mustAdd(t, b, fmt.Sprintf("k%02d", i), AddOptions{Priority: uint64(100 + i)})
		}
		jobs, err = b.q.AcceptMany(b.ctx, typA, 2, AcceptOptions{Share: func(int) int { return 0 }})
		if err != nil || len(jobs) != 2 {
			t.Fatalf("share 0, 40 pending, window 32 full: took %d jobs (%v), want 2 (no bound)", len(jobs), err)
		}
		jobs, err = b.q.AcceptMany(b.ctx, typA, 64, AcceptOptions{})
		if err != nil || len(jobs) != 38 {
			t.Fatalf("without Share: took %d jobs (%v), want the 38 left", len(jobs), err)
		}
	})
}
