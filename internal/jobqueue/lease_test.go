package jobqueue

import (
	"bytes"
	"errors"
	"slices"
	"strings"
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

		// A job watched again (a parked job hibernated after it ran): the
		// older watch's stop, called late, leaves the newer one in place.
		for id := range held {
			if id != removed && id != finished {
				stale := stops[id]
				stops[id], _ = held[id].Watch(func() { kicked <- id }, func() { lost <- id })
				stale()
				break
			}
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
		select {
		case id := <-lost:
			t.Fatalf("job %s heard twice that the lease was lost", id)
		default:
		}
		// A watch of a job of a lease already lost hears it at once.
		for id := range held {
			if id != removed && id != finished {
				held[id].Watch(func() {}, func() { lost <- id })
				break
			}
		}
		select {
		case <-lost:
		case <-time.After(10 * time.Second):
			t.Fatal("a watch after the lease was lost did not hear it")
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

// TestLeasesTakeover: two processes' queues share one store, each holding
// its jobs under its own lease; Leases shows each lease with its node and
// jobs and finds the records consistent. When one process goes silent for
// a timeout, the monitor re-enqueues its jobs and removes its lease; the
// other takes them under its own lease, and Leases shows every job held
// once, by the survivor; the silent process's writes under its old locks
// fail. A job entry naming the wrong lease is reported as inconsistent.
func TestLeasesTakeover(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		a := setup(t, Options{NodeName: "a"})
		b := &bundle{db: a.db, q: New(a.db, Options{NodeName: "b", Clock: a.clock.Now}), clock: a.clock, ctx: a.ctx}
		ids := []string{"j0", "j1", "j2", "j3", "j4", "j5"}
		for _, id := range ids {
			mustAdd(t, a, id, AddOptions{})
		}
		la, err := a.q.OpenLease(a.ctx, typA)
		if err != nil {
			t.Fatal(err)
		}
		lb, err := b.q.OpenLease(b.ctx, typA)
		if err != nil {
			t.Fatal(err)
		}
		held := map[string]*Job{}
		for k := range ids {
			q, l := a.q, la
			if k%2 == 1 {
				q, l = b.q, lb
			}
			j, err := q.Accept(a.ctx, typA, AcceptOptions{Lease: l})
			if err != nil {
				t.Fatal(err)
			}
			held[j.ID()] = j
		}
		byNode := func() map[string][]string {
			t.Helper()
			leases, err := a.q.Leases(a.ctx, typA)
			if err != nil {
				t.Fatalf("leases: %v", err)
			}
			out := map[string][]string{}
			for _, l := range leases {
				if l.Dead {
					t.Fatalf("lease %s of %s is dead", l.ID, l.Node)
				}
				if _, dup := out[l.Node]; dup {
					t.Fatalf("node %s holds two leases", l.Node)
				}
				out[l.Node] = l.Jobs
			}
			return out
		}
		if got := byNode(); len(got["a"]) != 3 || len(got["b"]) != 3 || len(got) != 2 {
			t.Fatalf("leases by node %v, want 3 jobs each on a and b", got)
		}

		// a goes silent; b renews. A monitor (on either node) re-enqueues
		// a's jobs once a's lease is a whole timeout old.
		m := b.q.NewMonitor(MonitorOptions{})
		t0 := time.Now()
		requeued := 0
		for k := range 4 {
			if err := lb.Renew(b.ctx); err != nil {
				t.Fatal(err)
			}
			n, err := m.Check(b.ctx, t0.Add(time.Duration(k)*40*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if k < 2 && n != 0 {
				t.Fatalf("check %d, less than a timeout after the first sample: re-enqueued %d", k, n)
			}
			requeued += n
		}
		if requeued != 3 {
			t.Fatalf("checks after a's lease expired re-enqueued %d jobs, want a's 3", requeued)
		}
		if got := byNode(); len(got) != 1 || len(got["b"]) != 3 {
			t.Fatalf("leases by node after a's expired: %v, want only b's with its 3 jobs", got)
		}
		for range 3 {
			if _, err := b.q.Accept(b.ctx, typA, AcceptOptions{Lease: lb}); err != nil {
				t.Fatal(err)
			}
		}
		if got := byNode(); len(got) != 1 || !slices.Equal(got["b"], ids) {
			t.Fatalf("leases by node after b took a's jobs: %v, want b holding %v", got, ids)
		}
		for id, j := range held {
			if j.q != a.q {
				continue
			}
			if err := j.Update(a.ctx, nil); !errors.Is(err, ErrWorkerConflict) {
				t.Fatalf("a's update of %s after the takeover: %v, want ErrWorkerConflict", id, err)
			}
		}
		mustAdd(t, a, "j6", AddOptions{})
		if _, err := a.q.Accept(a.ctx, typA, AcceptOptions{Lease: la}); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("accept under a's expired lease: %v, want ErrLeaseLost", err)
		}

		// A job entry naming another lease than the one holding it.
		if err := a.db.Transact(a.ctx, func(tx kv.Tx) error {
			v, err := tx.Get(a.q.keys.jobLeaseKey(typA, "j0"))
			if err != nil {
				return err
			}
			tx.Set(a.q.keys.jobLeaseKey(typA, "j0"), append(bytes.Clone(v[:lockLength]), "nosuchlease"...))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.q.Leases(a.ctx, typA); !errors.Is(err, ErrLeaseInconsistent) || !strings.Contains(err.Error(), "j0") {
			t.Fatalf("leases with a wrong job entry: %v, want ErrLeaseInconsistent naming j0", err)
		}
	})
}
