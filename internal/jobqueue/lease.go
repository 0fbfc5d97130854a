package jobqueue

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
	"github.com/couchrep/couchrep/messages"
)

// ErrLeaseLost: the lease expired (the activity monitor re-enqueued its
// jobs) or was closed; its jobs are no longer this worker's.
var ErrLeaseLost = errors.New("jobqueue: lease lost")

// Key-space tags of leases (see Lease).
const (
	tagLeases        = 10 // (LEASES, type, lease) = stamp(10) | dead(1) | node
	tagLeaseActivity = 11 // (LEASE_ACTIVITY, type, stamp, lease) = ""
	tagLeaseJobs     = 12 // (LEASE_JOBS, type, lease, id) = lock
	tagJobLease      = 13 // (JOB_LEASE, type, id) = lock | lease
	tagLeaseKick     = 14 // (LEASE_KICK, type, lease, id) = ""  a user canceled or removed the running job
)

func (k keys) leaseKey(typ, lease string) []byte {
	return k.root.Sub(tagLeases).Pack(tuple.Tuple{typ, lease})
}

func (k keys) leaseActivityKey(typ string, stamp [kv.VersionstampLength]byte, lease string) []byte {
	return k.root.Sub(tagLeaseActivity).Pack(tuple.Tuple{typ, tuple.Versionstamp{TransactionVersion: stamp}, lease})
}

func (k keys) leaseActivityRangeThrough(typ string, stamp [kv.VersionstampLength]byte) (begin, end []byte) {
	sub := k.root.Sub(tagLeaseActivity).Sub(typ)
	begin, _ = sub.Range()
	end = sub.Pack(tuple.Tuple{tuple.Versionstamp{TransactionVersion: stamp, UserVersion: math.MaxUint16}})
	return begin, end
}

func (k keys) leaseActivityRange(typ string) (begin, end []byte) {
	return k.root.Sub(tagLeaseActivity).Sub(typ).Range()
}

func (k keys) parseLeaseActivity(key []byte) (stamp [kv.VersionstampLength]byte, lease string, err error) {
	t, err := k.root.Sub(tagLeaseActivity).Unpack(key)
	if err == nil && len(t) == 3 {
		vs, ok1 := t[1].(tuple.Versionstamp)
		l, ok2 := t[2].(string)
		if ok1 && ok2 {
			return vs.TransactionVersion, l, nil
		}
	}
	return stamp, "", fmt.Errorf("%w: bad lease activity key %x", ErrCorrupt, key)
}

func (k keys) leaseJobKey(typ, lease, id string) []byte {
	return k.root.Sub(tagLeaseJobs).Pack(tuple.Tuple{typ, lease, id})
}

func (k keys) leaseJobsRange(typ, lease string) (begin, end []byte) {
	return k.root.Sub(tagLeaseJobs).Sub(typ, lease).Range()
}

func (k keys) jobLeaseKey(typ, id string) []byte {
	return k.root.Sub(tagJobLease).Pack(tuple.Tuple{typ, id})
}

func (k keys) leaseKickKey(typ, lease, id string) []byte {
	return k.root.Sub(tagLeaseKick).Pack(tuple.Tuple{typ, lease, id})
}

func (k keys) leaseKicksRange(typ, lease string) (begin, end []byte) {
	return k.root.Sub(tagLeaseKick).Sub(typ, lease).Range()
}

// lastTupleString is the last element of key unpacked in sub, a string.
func lastTupleString(sub tuple.Subspace, key []byte) (string, bool) {
	t, err := sub.Unpack(key)
	if err != nil || len(t) == 0 {
		return "", false
	}
	s, ok := t[len(t)-1].(string)
	return s, ok
}

// Lease proves a worker process alive for every job it accepted under the
// lease (AcceptOptions.Lease): one small write per Renew, however many jobs,
// instead of one Update per job per activity timeout. The activity monitor
// treats a leased job as active while its lease was renewed within the
// type's timeout; when a lease goes a whole timeout without renewal, the
// monitor re-enqueues every job still held under it (and Renew reports
// ErrLeaseLost from then on). A user's Remove or Cancel of a running leased
// job is passed to the worker through the lease: Renew calls the job's
// Watch callback. Renew at least twice per activity timeout (Keep does).
//
// Keys, under the queue's subspace:
//
//	(LEASES, type, lease)                  = renewal stamp | dead flag | node
//	(LEASE_ACTIVITY, type, stamp, lease)   = ""  one per lease
//	(LEASE_JOBS, type, lease, id)          = worker lock of each job held
//	(JOB_LEASE, type, id)                  = worker lock | lease
//	(LEASE_KICK, type, lease, id)          = ""  running job canceled or removed
type Lease struct {
	q      *Queue
	typ    string
	id     string
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu sync.Mutex
	// watches are the leased jobs' callbacks (Job.Watch), called from
	// Renew (kick) and once the lease is lost (lost: lostAll, the one
	// context.AfterFunc of the lease, not one per job).
	watches   map[string]jobWatch
	lost      bool              // lostAll ran
	watchN    uint64            // numbers the watches: a stale stop removes nothing
	abandoned map[string][]byte // job id -> lock: runs the worker gave up on (Job.Abandon)
}

// jobWatch is a leased job's callbacks (Job.Watch), n its number.
type jobWatch struct {
	kick, lost func()
	n          uint64
}

// lostAll calls every watched job's lost callback: the lease is lost.
func (l *Lease) lostAll() {
	l.mu.Lock()
	l.lost = true
	fns := make([]func(), 0, len(l.watches))
	for _, w := range l.watches {
		fns = append(fns, w.lost)
	}
	l.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

// OpenLease starts a lease for jobs of typ.
func (q *Queue) OpenLease(ctx context.Context, typ string) (*Lease, error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	l := &Lease{q: q, typ: typ, id: hex.EncodeToString(b[:]), watches: map[string]jobWatch{}, abandoned: map[string][]byte{}}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	context.AfterFunc(l.ctx, l.lostAll)
	err := q.db.Transact(kv.WithPriority(ctx), func(tx kv.Tx) error {
		if err := q.checkType(tx, typ); err != nil {
			return err
		}
		return l.stamp(tx)
	})
	if err != nil {
		l.cancel(err)
		return nil, fmt.Errorf("jobqueue: open lease: %w", err)
	}
	return l, nil
}

// ID returns the lease's id.
func (l *Lease) ID() string { return l.id }

// Lost is closed when the lease is lost (Renew found it expired) or closed.
func (l *Lease) Lost() <-chan struct{} { return l.ctx.Done() }

// stamp writes the lease value and its activity entry under this
// transaction's versionstamp.
func (l *Lease) stamp(tx kv.Tx) error {
	v := make([]byte, kv.VersionstampLength+1, kv.VersionstampLength+1+len(l.q.node))
	v = append(v, l.q.node...)
	if err := tx.SetVersionstampedValue(l.q.keys.leaseKey(l.typ, l.id), v, 0); err != nil {
		return err
	}
	key, off, err := l.q.keys.root.Sub(tagLeaseActivity).PackWithVersionstamp(tuple.Tuple{l.typ, tuple.IncompleteVersionstamp(0), l.id})
	if err != nil {
		return err
	}
	return tx.SetVersionstampedKey(key, off, nil)
}

// leaseValue splits a stored lease value.
func leaseValue(v []byte) (stamp [kv.VersionstampLength]byte, dead, ok bool) {
	if len(v) < kv.VersionstampLength+1 {
		return stamp, false, false
	}
	copy(stamp[:], v)
	return stamp, v[kv.VersionstampLength] != 0, true
}

// Renew proves the worker alive for every job held under the lease, and
// calls the Watch callback of every job a user canceled or removed since.
// It returns ErrLeaseLost (and Lost is closed) if the lease expired. It
// runs in the store's liveness lane (kv.WithPriority), as OpenLease does.
func (l *Lease) Renew(ctx context.Context) error {
	var kicked []string
	l.mu.Lock()
	abandoned := make(map[string][]byte, len(l.abandoned))
	for id, lock := range l.abandoned {
		abandoned[id] = lock
	}
	l.mu.Unlock()
	// The liveness lane: a renewal that waited behind the node's job
	// transactions for a whole timeout would lose every job it holds.
	err := l.q.db.Transact(kv.WithPriority(ctx), func(tx kv.Tx) error {
		kicked = kicked[:0]
		v, err := tx.Get(l.q.keys.leaseKey(l.typ, l.id))
		if err != nil {
			return err
		}
		stamp, dead, ok := leaseValue(v)
		if !ok || dead {
			return ErrLeaseLost
		}
		// The lease is renewed only together with the release of the runs
		// its holder gave up on: those go back to the queue now.
		now := l.q.clock()
		for id, lock := range abandoned {
			if lease, err := l.q.leaseOf(tx, l.typ, id, lock); err != nil {
				return err
			} else if lease != l.id {
				continue
			}
			if err := l.q.releaseLease(tx, l.typ, id); err != nil {
				return err
			}
			rec, err := l.q.loadRecord(tx, l.typ, id)
			if err != nil && !errors.Is(err, ErrCorrupt) {
				return err
			}
			if rec != nil && rec.GetState() == messages.JobState_JOB_STATE_RUNNING && bytes.Equal(rec.GetWorkerLock(), lock) {
				l.q.clearActivity(tx, rec)
				if err := l.q.requeueRecord(tx, rec, now); err != nil {
					return err
				}
			}
		}
		tx.Clear(l.q.keys.leaseActivityKey(l.typ, stamp, l.id))
		if err := l.stamp(tx); err != nil {
			return err
		}
		begin, end := l.q.keys.leaseKicksRange(l.typ, l.id)
		keys, err := kv.Keys(tx.GetRange(begin, end, kv.RangeOptions{}))
		if err != nil {
			return err
		}
		for _, key := range keys {
			id, ok := lastTupleString(l.q.keys.root.Sub(tagLeaseKick), key)
			if !ok {
				tx.Clear(key)
				continue
			}
			kicked = append(kicked, id)
			// A removed job is no member any more: nobody else clears it.
			if jl, err := tx.Get(l.q.keys.jobLeaseKey(l.typ, id)); err != nil {
				return err
			} else if jl == nil || string(jl[min(lockLength, len(jl)):]) != l.id {
				tx.Clear(key)
			}
		}
		return nil
	})
	if errors.Is(err, ErrLeaseLost) {
		l.cancel(ErrLeaseLost)
		return err
	}
	if err != nil {
		return fmt.Errorf("jobqueue: renew lease: %w", err)
	}
	l.mu.Lock()
	for id := range abandoned {
		delete(l.abandoned, id)
	}
	var fns []func()
	for _, id := range kicked {
		if w, ok := l.watches[id]; ok && w.kick != nil {
			fns = append(fns, w.kick)
		}
	}
	l.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
	return nil
}

// Close ends the lease: it is removed if it holds no job any more;
// otherwise it is left to expire, so that the activity monitor re-enqueues
// what it still holds. Lost is closed either way.
func (l *Lease) Close(ctx context.Context) error {
	defer l.cancel(ErrLeaseLost)
	return l.q.db.Transact(ctx, func(tx kv.Tx) error {
		v, err := tx.Get(l.q.keys.leaseKey(l.typ, l.id))
		if err != nil {
			return err
		}
		stamp, _, ok := leaseValue(v)
		if !ok {
			return nil
		}
		begin, end := l.q.keys.leaseJobsRange(l.typ, l.id)
		it := tx.GetRange(begin, end, kv.RangeOptions{Limit: 1})
		held := it.Next()
		if err := it.Err(); err != nil {
			return err
		}
		if held {
			return nil
		}
		tx.Clear(l.q.keys.leaseKey(l.typ, l.id))
		tx.Clear(l.q.keys.leaseActivityKey(l.typ, stamp, l.id))
		return nil
	})
}

// Watch registers a leased job's callbacks: onKick when a user canceled or
// removed the running job (from Renew: the job's next worker call fails),
// onLost when the lease is lost. It returns false (and registers nothing)
// for a job accepted without a lease, which must Update at least twice per
// activity timeout instead. stop unregisters both.
func (j *Job) Watch(onKick, onLost func()) (stop func(), leased bool) {
	l := j.lease
	if l == nil {
		return func() {}, false
	}
	l.mu.Lock()
	lost := l.lost
	l.watchN++
	n := l.watchN
	if !lost {
		l.watches[j.id] = jobWatch{kick: onKick, lost: onLost, n: n}
	}
	l.mu.Unlock()
	if lost {
		go onLost()
	}
	return func() {
		l.mu.Lock()
		if w, ok := l.watches[j.id]; ok && w.n == n {
			delete(l.watches, j.id)
		}
		l.mu.Unlock()
	}, true
}

// Abandon tells the job's lease that the worker gave up on the run without
// ending it in the store (its final write failed): the lease's next renewal
// puts the job back in the queue, in the same transaction, so that a live
// lease never keeps a run nobody works on. A job without a lease is left to
// the activity monitor, as before.
func (j *Job) Abandon() {
	if l := j.lease; l != nil {
		l.mu.Lock()
		l.abandoned[j.id] = j.lock
		l.mu.Unlock()
	}
}

// holdUnder records that the job rec (just taken, running) is held under
// lease l: the lease must be alive.
func (q *Queue) holdUnder(tx kv.Tx, l *Lease, rec *messages.JobRecord) error {
	v, err := tx.Get(q.keys.leaseKey(l.typ, l.id))
	if err != nil {
		return err
	}
	if _, dead, ok := leaseValue(v); !ok || dead {
		return ErrLeaseLost
	}
	typ, id := rec.GetType(), rec.GetId()
	tx.Set(q.keys.leaseJobKey(typ, l.id, id), rec.GetWorkerLock())
	tx.Set(q.keys.jobLeaseKey(typ, id), append(bytes.Clone(rec.GetWorkerLock()), l.id...))
	return nil
}

// leaseOf returns the lease a running job is held under ("" if none, or if
// the entry is of another run than lock).
func (q *Queue) leaseOf(tx kv.ReadTx, typ, id string, lock []byte) (string, error) {
	v, err := tx.Get(q.keys.jobLeaseKey(typ, id))
	if err != nil || len(v) < lockLength || !bytes.Equal(v[:lockLength], lock) {
		return "", err
	}
	return string(v[lockLength:]), nil
}

// releaseLease takes job id out of its lease, if any (the run ended, or the
// job was re-enqueued), and returns that lease.
func (q *Queue) releaseLease(tx kv.Tx, typ, id string) error {
	_, err := q.leaveLease(tx, typ, id)
	return err
}

func (q *Queue) leaveLease(tx kv.Tx, typ, id string) (lease string, err error) {
	v, err := tx.Get(q.keys.jobLeaseKey(typ, id))
	if err != nil || v == nil {
		return "", err
	}
	tx.Clear(q.keys.jobLeaseKey(typ, id))
	if len(v) >= lockLength {
		lease = string(v[lockLength:])
		tx.Clear(q.keys.leaseJobKey(typ, lease, id))
		tx.Clear(q.keys.leaseKickKey(typ, lease, id))
	}
	return lease, nil
}

// removeFromLease takes removed running job id out of its lease (if any)
// and tells the lease's holder at its next renewal.
func (q *Queue) removeFromLease(tx kv.Tx, typ, id string) error {
	lease, err := q.leaveLease(tx, typ, id)
	if err != nil || lease == "" {
		return err
	}
	tx.Set(q.keys.leaseKickKey(typ, lease, id), nil)
	return nil
}

// kick tells the lease holding running job id (if any) that a user canceled
// it; the job stays held until its worker's next call finishes it.
func (q *Queue) kick(tx kv.Tx, typ, id string) error {
	v, err := tx.Get(q.keys.jobLeaseKey(typ, id))
	if err != nil || len(v) < lockLength {
		return err
	}
	tx.Set(q.keys.leaseKickKey(typ, string(v[lockLength:]), id), nil)
	return nil
}

// leaseCovers reports whether running job rec is held under a lease
// renewed after threshold.
func (q *Queue) leaseCovers(tx kv.Tx, rec *messages.JobRecord, threshold [kv.VersionstampLength]byte) (bool, error) {
	lease, err := q.leaseOf(tx, rec.GetType(), rec.GetId(), rec.GetWorkerLock())
	if err != nil || lease == "" {
		return false, err
	}
	v, err := tx.Get(q.keys.leaseKey(rec.GetType(), lease))
	if err != nil {
		return false, err
	}
	stamp, dead, ok := leaseValue(v)
	return ok && !dead && bytes.Compare(stamp[:], threshold[:]) > 0, nil
}

// expireLeases re-enqueues the jobs of every lease of typ not renewed since
// through, and removes those leases.
func (m *Monitor) expireLeases(ctx context.Context, typ string, through [kv.VersionstampLength]byte) (int, error) {
	q := m.q
	var stale [][]byte
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		begin, end := q.keys.leaseActivityRangeThrough(typ, through)
		var err error
		stale, err = kv.Keys(tx.Snapshot().GetRange(begin, end, kv.RangeOptions{Limit: m.opts.BatchSize}))
		return err
	})
	if err != nil {
		return 0, err
	}
	total := 0
	for _, key := range stale {
		n, err := m.expireLease(ctx, typ, key)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// expireLease re-enqueues the jobs held under the lease of activity entry
// key, a batch per transaction, then removes the lease. The first batch
// marks it dead, so that it can no longer be renewed.
func (m *Monitor) expireLease(ctx context.Context, typ string, key []byte) (int, error) {
	q := m.q
	stamp, lease, err := q.keys.parseLeaseActivity(key)
	if err != nil {
		return 0, q.db.Transact(ctx, func(tx kv.Tx) error { tx.Clear(key); return nil })
	}
	total := 0
	for done := false; !done; {
		n := 0
		err := q.db.Transact(ctx, func(tx kv.Tx) error {
			n, done = 0, false
			lkey := q.keys.leaseKey(typ, lease)
			v, err := tx.Get(lkey)
			if err != nil {
				return err
			}
			cur, dead, ok := leaseValue(v)
			if !ok || cur != stamp {
				tx.Clear(key) // a leftover entry: the lease is gone or was renewed
				done = true
				return nil
			}
			if !dead {
				v = bytes.Clone(v)
				v[kv.VersionstampLength] = 1
				tx.Set(lkey, v)
				q.log.Warn().Str("type", typ).Str("lease", lease).Str("worker_node", string(v[kv.VersionstampLength+1:])).
					Msg("activity timeout: lease expired, re-enqueueing its jobs")
			}
			begin, end := q.keys.leaseJobsRange(typ, lease)
			it := tx.GetRange(begin, end, kv.RangeOptions{Limit: m.opts.BatchSize})
			var members []kv.KeyValue
			for it.Next() {
				kvp := it.KeyValue()
				members = append(members, kv.KeyValue{Key: bytes.Clone(kvp.Key), Value: bytes.Clone(kvp.Value)})
			}
			if err := it.Err(); err != nil {
				return err
			}
			// The members' records and job-lease entries, read in one
			// round trip where the store allows (kv.GetMany): a dead
			// node's thousands of jobs were two reads each, one after
			// the other.
			ids := make([]string, len(members))
			reads := make([][]byte, 0, 2*len(members))
			for i, mem := range members {
				id, ok := lastTupleString(q.keys.root.Sub(tagLeaseJobs), mem.Key)
				if !ok {
					continue
				}
				ids[i] = id
				reads = append(reads, q.keys.dataKey(typ, id), q.keys.jobLeaseKey(typ, id))
			}
			vals, err := kv.GetMany(tx, reads)
			if err != nil {
				return err
			}
			now := q.clock()
			for i, mem := range members {
				id := ids[i]
				if id == "" {
					tx.Clear(mem.Key)
					continue
				}
				data, jl := vals[0], vals[1]
				vals = vals[2:]
				var rec *messages.JobRecord
				if data != nil {
					rec, err = decodeRecord(typ, id, data)
					if errors.Is(err, ErrCorrupt) {
						tx.Clear(mem.Key)
						continue
					}
					if err != nil {
						return err
					}
				}
				// releaseLease, with the job-lease entry read above.
				if jl != nil {
					tx.Clear(q.keys.jobLeaseKey(typ, id))
					if len(jl) >= lockLength {
						other := string(jl[lockLength:])
						tx.Clear(q.keys.leaseJobKey(typ, other, id))
						tx.Clear(q.keys.leaseKickKey(typ, other, id))
					}
				}
				tx.Clear(mem.Key)
				if rec == nil || rec.GetState() != messages.JobState_JOB_STATE_RUNNING || !bytes.Equal(rec.GetWorkerLock(), mem.Value) {
					continue
				}
				q.clearActivity(tx, rec)
				if err := q.requeueRecord(tx, rec, now); err != nil {
					return err
				}
				n++
			}
			if len(members) < m.opts.BatchSize {
				tx.Clear(lkey)
				tx.Clear(key)
				done = true
			}
			return nil
		})
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}
