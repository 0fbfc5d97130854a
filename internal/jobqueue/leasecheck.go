package jobqueue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/messages"
)

// ErrLeaseInconsistent is returned (wrapped) by Leases when the lease
// records disagree with each other or with the job records.
var ErrLeaseInconsistent = errors.New("jobqueue: lease records inconsistent")

// LeaseInfo is one lease as the store records it.
type LeaseInfo struct {
	// ID is the lease's id, Node the node of the process holding it.
	ID, Node string
	// Dead: the activity monitor found it expired and is re-enqueueing
	// its jobs (it can no longer be renewed).
	Dead bool
	// Jobs are the ids of the jobs held under it, sorted.
	Jobs []string
}

// Leases returns every lease of typ, read in one transaction, and checks
// that the lease records agree with the job records: every job a lease
// holds is running under the worker lock the lease recorded, on the
// lease's node, and names that lease back; every job naming a lease is
// held by it; no job is held by two leases. Disagreements are returned
// together, wrapping ErrLeaseInconsistent, with the leases read. It is the
// proof, for tests and operators, that a job runs under at most one
// process's lease.
func (q *Queue) Leases(ctx context.Context, typ string) ([]LeaseInfo, error) {
	var (
		out  []LeaseInfo
		errs []error
	)
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		out, errs = nil, nil
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrLeaseInconsistent}, args...)...))
		}
		leases := map[string]*LeaseInfo{}
		sub := q.keys.root.Sub(tagLeases).Sub(typ)
		begin, end := sub.Range()
		it := tx.GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			e := it.KeyValue()
			id, ok := lastTupleString(sub, e.Key)
			_, dead, okv := leaseValue(e.Value)
			if !ok || !okv {
				bad("unreadable lease entry %x", e.Key)
				continue
			}
			leases[id] = &LeaseInfo{ID: id, Node: string(e.Value[kv.VersionstampLength+1:]), Dead: dead}
		}
		if err := it.Err(); err != nil {
			return err
		}
		// (LEASE_JOBS, type, lease, id) = lock
		held := map[string]string{} // job id -> lease
		sub = q.keys.root.Sub(tagLeaseJobs).Sub(typ)
		begin, end = sub.Range()
		it = tx.GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			e := it.KeyValue()
			t, err := sub.Unpack(e.Key)
			if err != nil || len(t) != 2 {
				bad("unreadable lease member %x", e.Key)
				continue
			}
			lease, ok1 := t[0].(string)
			id, ok2 := t[1].(string)
			if !ok1 || !ok2 {
				bad("unreadable lease member %x", e.Key)
				continue
			}
			l := leases[lease]
			if l == nil {
				bad("job %s is held by lease %s, which does not exist", id, lease)
				continue
			}
			if other, dup := held[id]; dup {
				bad("job %s is held by two leases: %s and %s", id, other, lease)
			}
			held[id] = lease
			l.Jobs = append(l.Jobs, id)
			jl, err := tx.Get(q.keys.jobLeaseKey(typ, id))
			if err != nil {
				return err
			}
			if len(jl) < lockLength || !bytes.Equal(jl[:lockLength], e.Value) || string(jl[lockLength:]) != lease {
				bad("job %s is held by lease %s (lock %x), but its own entry names %q", id, lease, e.Value, jl)
			}
			rec, err := q.loadRecord(tx, typ, id)
			if err != nil && !errors.Is(err, ErrCorrupt) {
				return err
			}
			switch {
			case rec == nil:
				bad("job %s is held by lease %s but does not exist", id, lease)
			case rec.GetState() != messages.JobState_JOB_STATE_RUNNING:
				bad("job %s is held by lease %s but is %v", id, lease, rec.GetState())
			case !bytes.Equal(rec.GetWorkerLock(), e.Value):
				bad("job %s is held by lease %s under lock %x, but runs under lock %x", id, lease, e.Value, rec.GetWorkerLock())
			case rec.GetWorkerNode() != l.Node:
				bad("job %s is held by lease %s of node %s, but runs on node %s", id, lease, l.Node, rec.GetWorkerNode())
			}
		}
		if err := it.Err(); err != nil {
			return err
		}
		// (JOB_LEASE, type, id) = lock | lease
		sub = q.keys.root.Sub(tagJobLease).Sub(typ)
		begin, end = sub.Range()
		it = tx.GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			e := it.KeyValue()
			id, ok := lastTupleString(sub, e.Key)
			if !ok || len(e.Value) < lockLength {
				bad("unreadable job lease entry %x", e.Key)
				continue
			}
			if lease := string(e.Value[lockLength:]); held[id] != lease {
				bad("job %s names lease %s, which does not hold it", id, lease)
			}
		}
		if err := it.Err(); err != nil {
			return err
		}
		for _, l := range leases {
			sort.Strings(l.Jobs)
			out = append(out, *l)
		}
		sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("jobqueue: read leases of %q: %w", typ, err)
	}
	return out, errors.Join(errs...)
}
