package jobqueue

import (
	"errors"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/storetest"
)

// TestLease: jobs held under a lease stay running through many activity
// timeouts while only the lease is renewed (their own activity entries are
// dropped); a user's Remove reaches the job's worker at the next renewal; a
// finished job leaves the lease; once the lease goes a timeout without
// renewal the monitor re-enqueues the jobs it still holds, Renew and Accept
// report ErrLeaseLost and the watchers hear of it; a run abandoned by its
// worker goes back to the queue with the next renewal; Close removes an
// empty lease and leaves no lease keys behind.
func TestLease(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		for _, id := range []string{"a", "b", "c", "d", "e"} {
			mustAdd(t, b, id, AddOptions{})
		}
		l, err := b.q.OpenLease(b.ctx, typA)
		if err != nil {
			t.Fatal(err)
		}
		kicked, lost := make(chan string, 8), make(chan string, 8)
		held := map[string]*Job{}
		stops := map[string]func(){}
		for range 4 {
			j, err := b.q.Accept(b.ctx, typA, AcceptOptions{Lease: l})
			if err != nil {
				t.Fatal(err)
			}
			id := j.ID()
			held[id] = j
			stop, leased := j.Watch(func() { kicked <- id }, func() { lost <- id })
			if !leased {
				t.Fatalf("job %s accepted under a lease is not leased", id)
			}
			stops[id] = stop
		}
		m := b.q.NewMonitor(MonitorOptions{BatchSize: 2})
		t0 := time.Now()
		for k := range 4 {
			if err := l.Renew(b.ctx); err != nil {
				t.Fatal(err)
			}
			if n, err := m.Check(b.ctx, t0.Add(time.Duration(k)*time.Minute)); err != nil || n != 0 {
				t.Fatalf("check %d with the lease renewed: re-enqueued %d (%v), want 0", k, n, err)
			}
		}
		for id := range held {
			mustState(t, b, id, StateRunning)
		}

		var removed, finished string
		for id := range held {
			if removed == "" {
				removed = id
			} else if finished == "" {
				finished = id
			}
		}
		if err := b.q.Remove(b.ctx, typA, removed); err != nil {
			t.Fatal(err)
		}
		if err := l.Renew(b.ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case id := <-kicked:
			if id != removed {
				t.Fatalf("renewal kicked %s, want %s", id, removed)
			}
		default:
			t.Fatalf("renewal did not tell the worker of removed job %s", removed)
		}
		if err := held[removed].Update(b.ctx, nil); !errors.Is(err, ErrCanceled) {
			t.Fatalf("update of removed job: %v", err)
		}
		stops[removed]()
		if err := held[finished].Finish(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		stops[finished]()
		if err := l.Renew(b.ctx); err != nil {
			t.Fatal(err)
		}
		if len(kicked) != 0 {
			t.Fatalf("a kick was delivered twice")
		}

		// No renewal for a whole timeout: the two jobs still held go back.
		if n, err := m.Check(b.ctx, t0.Add(5*time.Minute)); err != nil || n != 0 {
			t.Fatalf("check a minute after the last sample: re-enqueued %d (%v), want 0", n, err)
		}
		n, err := m.Check(b.ctx, t0.Add(6*time.Minute))
		if err != nil || n != 2 {
			t.Fatalf("check after the lease expired: re-enqueued %d (%v), want 2", n, err)
		}
		for id := range held {
			if id != removed && id != finished {
				mustState(t, b, id, StatePending)
				if err := held[id].Update(b.ctx, nil); !errors.Is(err, ErrWorkerConflict) {
					t.Fatalf("update of re-enqueued job %s: %v", id, err)
				}
			}
		}
		if err := l.Renew(b.ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("renew of an expired lease: %v", err)
		}
		for range 2 {
			select {
			case <-lost:
			case <-time.After(10 * time.Second):
				t.Fatal("a watcher did not hear that the lease was lost")
			}
		}
		if _, err := b.q.Accept(b.ctx, typA, AcceptOptions{Lease: l}); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("accept under an expired lease: %v", err)
		}

		l2, err := b.q.OpenLease(b.ctx, typA)
		if err != nil {
			t.Fatal(err)
		}
		j, err := b.q.Accept(b.ctx, typA, AcceptOptions{Lease: l2})
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Resubmit(b.ctx, nil, ResubmitOptions{}); err != nil {
			t.Fatal(err)
		}
		// A run its worker gives up on goes back with the next renewal.
		j2, err := b.q.Accept(b.ctx, typA, AcceptOptions{Lease: l2})
		if err != nil {
			t.Fatal(err)
		}
		j2.Abandon()
		if err := l2.Renew(b.ctx); err != nil {
			t.Fatal(err)
		}
		mustState(t, b, j2.ID(), StatePending)
		if err := l2.Close(b.ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Check(b.ctx, t0.Add(8*time.Minute)); err != nil {
			t.Fatal(err)
		}
		for _, tag := range []int{tagLeases, tagLeaseActivity, tagLeaseJobs, tagJobLease, tagLeaseKick} {
			begin, end := b.q.keys.root.Sub(tag).Range()
			if err := b.db.ReadTransact(b.ctx, func(tx kv.ReadTx) error {
				it := tx.GetRange(begin, end, kv.RangeOptions{})
				for it.Next() {
					t.Errorf("lease key left behind (tag %d): %x", tag, it.KeyValue().Key)
				}
				return it.Err()
			}); err != nil {
				t.Fatal(err)
			}
		}
	})
}
