package jobqueue

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/messages"
)

const lockLength = 16

// promoteBatch bounds how many due DELAYED entries one Accept moves to READY.
const promoteBatch = 64

// AcceptOptions narrows what Accept takes.
type AcceptOptions struct {
	// MaxPriority, if HasMaxPriority, excludes jobs whose priority is
	// greater (for instance jobs whose virtual deadline is too far away).
	MaxPriority    uint64
	HasMaxPriority bool
	// Wait makes Accept block until a job is eligible (woken by a kv watch
	// on the type's pending counter, or by the next scheduled time) or ctx
	// ends. Without it Accept returns ErrNotFound at once.
	Wait bool
	// Lease, if set, holds the accepted job: the lease's renewals prove
	// the worker alive instead of the job's own Updates (see Lease). Accept
	// fails with ErrLeaseLost if the lease expired.
	Lease *Lease
	// Share, if set, bounds what AcceptMany takes to this worker's share
	// of the pending jobs (so that the nodes of a cluster accept about as
	// many each, schedpolicy.AcceptShare): given how many eligible pending
	// jobs the transaction sees, it returns how many this worker may take;
	// 0 or less: none, and AcceptMany fails with ErrOverShare. It is not
	// asked when the window of the queue head AcceptMany reads is full
	// (16 n jobs or more pending: the batch is not bounded). Accept ignores
	// it.
	Share func(pending int) int
}

// Job is a job accepted by a worker: it carries the worker lock, and its
// methods are the worker API. A Job is not safe for concurrent use.
type Job struct {
	q     *Queue
	typ   string
	id    string
	lock  []byte
	info  *JobInfo
	lease *Lease // the lease holding the job, if any
	// kept is what Info answers once DropData dropped info (nil then):
	// a parked job keeps these few fields, not a whole JobInfo.
	kept keptInfo
}

// keptInfo is the part of a JobInfo a Job keeps after DropData.
type keptInfo struct {
	priority, acceptCount uint64
	state                 State
}

// Type returns the job type.
func (j *Job) Type() string { return j.typ }

// ID returns the job id.
func (j *Job) ID() string { return j.id }

// Lock returns the worker lock (16 random bytes) this Job holds.
func (j *Job) Lock() []byte { return bytes.Clone(j.lock) }

// Info returns the job as of the last successful call on it (Accept,
// Update...). ResubmitRequested and CancelRequested there tell the worker
// what users asked for.
//
// After DropData it has only the job's identity, state, priority and
// accept count (built anew at each call) until the next call on the job.
func (j *Job) Info() *JobInfo {
	if j.info == nil {
		return &JobInfo{Type: j.typ, ID: j.id, State: j.kept.state, Priority: j.kept.priority,
			AcceptCount: j.kept.acceptCount, WorkerNode: j.q.node}
	}
	return j.info
}

// DropData forgets the job's data as last read or written (JobInfo.Data):
// a worker that keeps a job for long without working on it (a parked
// replication) holds its lock, not its payload: Info answers only the
// job's identity, state, priority and accept count until the next call on
// the job. Not safe for concurrent use with the job's other calls.
func (j *Job) DropData() {
	if j.info != nil {
		j.kept = keptInfo{priority: j.info.Priority, acceptCount: j.info.AcceptCount, state: j.info.State}
		j.info = nil
	}
}

// Accept takes a pending job of typ whose scheduled time has come: one
// chosen at random among the first AcceptSpread eligible jobs in priority
// order (or one of those that an earlier Accept of this Queue read and
// did not take, less than 100 ms ago, while it is still pending and due:
// one read of the queue head serves up to AcceptSpread Accepts). It returns the Job holding a new worker lock, or ErrNotFound when
// nothing is eligible and opts.Wait is false.
func (q *Queue) Accept(ctx context.Context, typ string, opts AcceptOptions) (*Job, error) {
	for {
		var (
			job  *Job
			w    kv.Watch
			next time.Time
		)
		noJob := false
		var claims []string
		// An attempt that promoted and did not commit: the next one
		// promotes again (promoteDue counted the promotion as done).
		promoted := false
		err := q.db.Transact(ctx, func(tx kv.Tx) error {
			var err error
			if w != nil { // from an attempt that did not commit
				w.Cancel()
			}
			w, next, noJob = nil, time.Time{}, false
			job, err = q.acceptTx(tx, typ, opts, &claims, &promoted)
			if !errors.Is(err, errNoJob) {
				return err
			}
			// Commit anyway: promotions and stale-entry cleanups stick.
			noJob, err = true, nil
			if opts.Wait {
				w = tx.Watch(q.keys.pendingWatchKey(typ))
				next, err = q.nextScheduled(tx, typ)
			}
			return err
		})
		q.release(claims)
		if err != nil {
			if w != nil {
				w.Cancel()
			}
			return nil, wrapOp("accept", typ, "", err)
		}
		if noJob && !opts.Wait {
			return nil, wrapOp("accept", typ, "", fmt.Errorf("%w: no eligible pending job", ErrNotFound))
		}
		if job != nil {
			return job, nil
		}
		if err := q.waitPending(ctx, w, next); err != nil {
			return nil, wrapOp("accept", typ, "", err)
		}
	}
}

// waitPending blocks until w fires, next comes or ctx ends.
func (q *Queue) waitPending(ctx context.Context, w kv.Watch, next time.Time) error {
	defer w.Cancel()
	wctx := ctx
	if !next.IsZero() {
		var cancel context.CancelFunc
		// The scheduled time is by q.clock; the wait is on the real clock.
		wctx, cancel = context.WithTimeout(ctx, max(time.Millisecond, next.Sub(q.clock())))
		defer cancel()
	}
	err := w.Wait(wctx)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		return nil // the next scheduled job is due
	}
	return err
}

func (q *Queue) nextScheduled(tx kv.Tx, typ string) (time.Time, error) {
	begin, end := q.keys.delayedRange(typ, time.Time{})
	it := tx.Snapshot().GetRange(begin, end, kv.RangeOptions{Limit: 1})
	for it.Next() {
		sched, _, err := q.keys.parseDelayed(it.KeyValue().Key)
		if err != nil {
			return time.Time{}, err
		}
		return sched, nil
	}
	return time.Time{}, it.Err()
}

// AcceptTx is Accept inside the caller's transaction; opts.Wait is
// ignored. It returns an error wrapping ErrNotFound when nothing is
// eligible.
func (q *Queue) AcceptTx(tx kv.Tx, typ string, opts AcceptOptions) (*Job, error) {
	job, err := q.acceptTx(tx, typ, opts, nil, new(bool))
	if errors.Is(err, errNoJob) {
		return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return job, err
}

// acceptTx is one attempt of Accept. *promoted says whether an earlier
// attempt of the same Accept promoted DELAYED entries (then this one does
// too: that attempt did not commit, and promoteDue will not say so again
// for promoteEvery); acceptTx sets it when this attempt promotes.
func (q *Queue) acceptTx(tx kv.Tx, typ string, opts AcceptOptions, claims *[]string, promotedBefore *bool) (*Job, error) {
	if err := q.checkType(tx, typ); err != nil {
		return nil, err
	}
	now := q.clock()
	promoted := *promotedBefore || q.promoteDue(typ, now)
	*promotedBefore = promoted
	if promoted {
		if err := q.promote(tx, typ, now); err != nil {
			return nil, err
		}
	}
	maxPrio := ^uint64(0)
	if opts.HasMaxPriority {
		maxPrio = opts.MaxPriority
	}
	cache := claims != nil && !opts.HasMaxPriority
	if cache && !promoted {
		// The head another Accept of this process read and left: no read
		// of the queue head for this one if its job is still there.
		if key := q.popHead(typ, now, claims); key != nil {
			job, err := q.takeCached(tx, typ, key, now, opts.Lease)
			if err != nil || job != nil {
				return job, err
			}
			q.dropHead(typ) // the head moved on: read it again
		}
	}
	begin, end := q.keys.readyRange(typ, maxPrio)
	snap := tx.Snapshot()
	for {
		// Snapshot read: acceptors must not conflict on the whole queue head.
		cands, err := kv.Keys(snap.GetRange(begin, end, kv.RangeOptions{Limit: q.spread}))
		if err != nil {
			return nil, err
		}
		if len(cands) == 0 {
			if promoted {
				return nil, errNoJob
			}
			// Nothing ready: due DELAYED jobs must not wait for the next
			// periodic promotion.
			promoted, *promotedBefore = true, true
			if err := q.promote(tx, typ, now); err != nil {
				return nil, err
			}
			continue
		}
		mrand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
		q.preferUnclaimed(cands)
		for i, key := range cands {
			if claims != nil {
				q.claim(key, claims)
			}
			job, err := q.take(tx, typ, key, now, opts.Lease)
			if err != nil {
				return nil, err
			}
			if job != nil {
				if cache {
					q.pushHead(typ, cands[i+1:], now)
				}
				return job, nil
			}
		}
		// Every candidate was stale (and is cleared now): look further.
		last := cands[0]
		for _, c := range cands[1:] {
			if bytes.Compare(c, last) > 0 {
				last = c
			}
		}
		begin = append(last, 0x00)
	}
}

// headTTL bounds how long the READY keys an Accept read and left
// (headCache) are tried by the next Accepts before the head is read again:
// a job enqueued meanwhile with a better priority waits at most that
// long (or until the cached keys run out) to compete, as a due DELAYED
// job waits up to promoteEvery.
const headTTL = promoteEvery

// headCache is what an Accept's read of a type's queue head returned and
// did not try: the next Accepts of this process take those keys first,
// each with its record read alone, one round trip fewer (of two reads),
// as long as they are younger than headTTL and the last one tried was
// still pending. They stay claimed (preferUnclaimed) while cached.
type headCache struct {
	keys [][]byte
	at   time.Time
}

// popHead takes a cached head key of typ, if any younger than headTTL;
// its claim becomes the caller's (released with claims).
func (q *Queue) popHead(typ string, now time.Time, claims *[]string) []byte {
	q.claimMu.Lock()
	defer q.claimMu.Unlock()
	h := q.heads[typ]
	if h == nil {
		return nil
	}
	if now.Sub(h.at) >= headTTL || now.Before(h.at) {
		q.dropHeadLocked(typ)
		return nil
	}
	k := h.keys[len(h.keys)-1]
	if h.keys = h.keys[:len(h.keys)-1]; len(h.keys) == 0 {
		delete(q.heads, typ)
	}
	*claims = append(*claims, string(k))
	return k
}

// pushHead caches keys (read from typ's head at now, untried) in place
// of what was cached, claiming those no Accept claims.
func (q *Queue) pushHead(typ string, keys [][]byte, now time.Time) {
	q.claimMu.Lock()
	defer q.claimMu.Unlock()
	q.dropHeadLocked(typ)
	h := &headCache{at: now}
	for _, k := range keys {
		if _, ok := q.claimed[string(k)]; ok {
			continue
		}
		q.claimed[string(k)] = struct{}{}
		h.keys = append(h.keys, k)
	}
	if len(h.keys) > 0 {
		q.heads[typ] = h
	}
}

// dropHead forgets typ's cached head keys.
func (q *Queue) dropHead(typ string) {
	q.claimMu.Lock()
	defer q.claimMu.Unlock()
	q.dropHeadLocked(typ)
}

func (q *Queue) dropHeadLocked(typ string) {
	if h := q.heads[typ]; h != nil {
		for _, k := range h.keys {
			delete(q.claimed, string(k))
		}
		delete(q.heads, typ)
	}
}

// preferUnclaimed moves the keys that no other Accept of this process is
// trying right now to the front (keeping their random order), so that
// acceptors in one process do not collide on the same job; on a conflict
// the loser would only retry its transaction.
func (q *Queue) preferUnclaimed(keys [][]byte) {
	q.claimMu.Lock()
	defer q.claimMu.Unlock()
	if len(q.claimed) == 0 {
		return
	}
	n := 0
	for i, k := range keys {
		if _, ok := q.claimed[string(k)]; !ok {
			keys[n], keys[i] = keys[i], keys[n]
			n++
		}
	}
}

// claim marks key as being tried by this process's Accept; release undoes
// the claims once its transaction is over.
func (q *Queue) claim(key []byte, claims *[]string) {
	q.claimMu.Lock()
	defer q.claimMu.Unlock()
	k := string(key)
	if _, ok := q.claimed[k]; !ok {
		q.claimed[k] = struct{}{}
		*claims = append(*claims, k)
	}
}

func (q *Queue) release(claims []string) {
	if len(claims) == 0 {
		return
	}
	q.claimMu.Lock()
	defer q.claimMu.Unlock()
	for _, k := range claims {
		delete(q.claimed, k)
	}
}

// take tries to accept the job of READY entry key. It returns (nil, nil)
// if the entry was stale (and clears it).
//
// The job record is read with a conflict; the entry itself needs none (it
// was read, without conflict, in this transaction's snapshot). Every
// commit that adds or removes the READY entry of a pending record also
// writes that record (enqueue, dequeue and take all do) except two: a
// promotion from DELAYED, which only adds entries, and the clearing of a
// stale entry, which happens only while the record does not match the
// entry, and then take does not accept it either. So the record read
// conflicts whenever the entry could have gone.
func (q *Queue) take(tx kv.Tx, typ string, key []byte, now time.Time, lease *Lease) (*Job, error) {
	prio, rec, err := entryRecord(q, tx, typ, "pending", key, q.keys.parseReady)
	if err != nil {
		return nil, err
	}
	if rec == nil || rec.GetState() != messages.JobState_JOB_STATE_PENDING || rec.GetPriority() != prio {
		return nil, nil
	}
	return q.start(tx, typ, rec, now, lease)
}

// takeCached is take for a READY key an earlier transaction read
// (headCache): this one did not read the entry, so it accepts the job
// only if its record is pending with the key's priority and due now, and
// otherwise changes nothing (the entry, if any, is someone else's to
// clear: the job may have been accepted and resubmitted meanwhile, to a
// DELAYED entry or a new priority). The record is read without a
// conflict first, so that a miss (most often a job another process took
// and is now updating) adds none; a hit adds it: accepting commits only
// if the record was not written since this snapshot.
func (q *Queue) takeCached(tx kv.Tx, typ string, key []byte, now time.Time, lease *Lease) (*Job, error) {
	prio, id, err := q.keys.parseReady(key)
	if err != nil {
		return nil, nil
	}
	dk := q.keys.dataKey(typ, id)
	v, err := tx.Snapshot().Get(dk)
	if err != nil || v == nil {
		return nil, err
	}
	rec, err := decodeRecord(typ, id, v)
	if err != nil || rec.GetState() != messages.JobState_JOB_STATE_PENDING || rec.GetPriority() != prio ||
		tsTime(rec.GetScheduledAt()).After(now) {
		return nil, nil // a corrupt record is for the head read to find and mark
	}
	tx.AddReadConflictKey(dk)
	tx.Clear(key)
	return q.start(tx, typ, rec, now, lease)
}

// start makes the pending record rec running under a new worker lock
// (and lease), its READY entry already cleared.
func (q *Queue) start(tx kv.Tx, typ string, rec *messages.JobRecord, now time.Time, lease *Lease) (*Job, error) {
	id := rec.GetId()
	lock := make([]byte, lockLength)
	_, _ = rand.Read(lock) // crypto/rand.Read never fails (Go 1.24+)
	rec.State = messages.JobState_JOB_STATE_RUNNING
	rec.WorkerLock = lock
	rec.WorkerNode = q.node
	rec.AcceptCount++
	rec.StartedAt = timeTS(now)
	rec.UpdatedAt = timeTS(now)
	rec.FinishedAt = nil
	if err := q.storeRunning(tx, rec); err != nil {
		return nil, err
	}
	if err := q.markRun(tx, typ, id, lock, true); err != nil {
		return nil, err
	}
	if lease != nil {
		if err := q.holdUnder(tx, lease, rec); err != nil {
			return nil, err
		}
	}
	return &Job{q: q, typ: typ, id: id, lock: lock, info: infoFromRecord(rec), lease: lease}, nil
}

// promoteEvery is how often Accept moves due DELAYED entries to READY
// while READY is not empty (always when it is): a job scheduled for time t
// competes by priority from at most about t+promoteEvery on, and most
// Accepts save a range read. A promotion is counted when an attempt makes
// it: if that attempt does not commit (a conflict), the Accept's next
// attempt promotes again. Without that, a promotion lost to a conflict
// left the due jobs out for another promoteEvery: on PostgreSQL, whose
// acceptors retry more, 63 of 296 promotions of a 30 s crash storm were
// lost (SQLite: 11 of 295); the jobs of the busiest _replicator database,
// back in a 1 ms backoff, waited 200 ms out of the queue while the other
// databases' jobs, whose deadlines were far ahead, were accepted; the
// fair-share frontier leapt past its account and it lost its place: its
// share 3 % below its weight, the smallest one's 9 % above
// (BenchmarkCrashStorm; 0.06 % with the promotion redone).
const promoteEvery = 100 * time.Millisecond

// promoteDue reports whether this Accept should promote, and if so
// records that it did.
func (q *Queue) promoteDue(typ string, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	last, ok := q.lastPromote[typ]
	if ok && now.Sub(last) < promoteEvery && !now.Before(last) {
		return false
	}
	q.lastPromote[typ] = now
	return true
}

// promote moves due DELAYED entries of typ to READY.
func (q *Queue) promote(tx kv.Tx, typ string, now time.Time) error {
	begin, end := q.keys.delayedRange(typ, now)
	due, err := kv.Keys(tx.Snapshot().GetRange(begin, end, kv.RangeOptions{Limit: promoteBatch}))
	if err != nil {
		return err
	}
	for _, key := range due {
		sched, rec, err := entryRecord(q, tx, typ, "delayed", key, q.keys.parseDelayed)
		if err != nil {
			return err
		}
		if rec != nil && rec.GetState() == messages.JobState_JOB_STATE_PENDING &&
			tsTime(rec.GetScheduledAt()).UnixNano() == sched.UnixNano() {
			tx.Set(q.keys.readyKey(typ, rec.GetPriority(), rec.GetId()), nil)
		}
	}
	return nil
}

// lockedRecord reads the job with a read conflict and checks that j still
// holds its lock.
func (j *Job) lockedRecord(tx kv.Tx) (*messages.JobRecord, error) {
	rec, err := j.q.loadRecord(tx, j.typ, j.id)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, fmt.Errorf("%w: job was removed", ErrCanceled)
	}
	if rec.GetState() != messages.JobState_JOB_STATE_RUNNING || !bytes.Equal(rec.GetWorkerLock(), j.lock) {
		return nil, ErrWorkerConflict
	}
	return rec, nil
}

// workerCall runs the lock check and, on a canceled job, finishes it as
// canceled (in tx) and returns ErrCanceled. Otherwise it clears the job's
// activity entry, replaces the job's data unless data is nil and hands the
// record to fn.
func (j *Job) workerCall(tx kv.Tx, data []byte, fn func(rec *messages.JobRecord, now time.Time) error) error {
	rec, err := j.lockedRecord(tx)
	if err != nil {
		return err
	}
	now := j.q.clock()
	if err := j.q.markRun(tx, j.typ, j.id, j.lock, false); err != nil {
		return err
	}
	j.q.clearActivity(tx, rec)
	if rec.GetCancelRequested() {
		if err := j.unlock(tx, rec); err != nil {
			return err
		}
		rec.State = messages.JobState_JOB_STATE_FINISHED
		rec.Canceled = true
		rec.FinishedAt = timeTS(now)
		rec.UpdatedAt = timeTS(now)
		if err := j.q.storeRecord(tx, rec); err != nil {
			return err
		}
		j.info = infoFromRecord(rec)
		return ErrCanceled
	}
	rec.UpdatedAt = timeTS(now)
	if data != nil {
		rec.Data = data
	}
	if err := fn(rec, now); err != nil {
		return err
	}
	j.info = infoFromRecord(rec)
	return nil
}

// unlock ends the worker's hold on rec: the run leaves its lease and the
// record its lock. Only a run accepted under a lease has a lease entry
// (holdUnder, at Accept; every way a run ends removes it): a run without
// one skips the read (one round trip of three in Finish on PostgreSQL).
func (j *Job) unlock(tx kv.Tx, rec *messages.JobRecord) error {
	if j.lease != nil {
		if err := j.q.releaseLease(tx, j.typ, j.id); err != nil {
			return err
		}
	}
	rec.WorkerLock = nil
	return nil
}

// Update records progress: it proves the worker is alive (resetting the
// activity timeout) and replaces the job's data unless data is nil. It
// returns ErrWorkerConflict if j lost its lock and ErrCanceled if the job
// was canceled (it is then finished as canceled) or removed.
func (j *Job) Update(ctx context.Context, data []byte) error {
	return j.transact(ctx, "update", func(tx kv.Tx) error { return j.UpdateTx(tx, data) })
}

// UpdateTx is Update inside the caller's transaction: commit the caller's
// type-specific writes only if it returns nil. (On ErrCanceled, committing
// anyway records the job as canceled at once; aborting leaves that to the
// activity monitor.)
func (j *Job) UpdateTx(tx kv.Tx, data []byte) error {
	return j.workerCall(tx, data, func(rec *messages.JobRecord, _ time.Time) error {
		return j.q.storeRunning(tx, rec)
	})
}

// Finish ends the run: the job becomes finished with data (nil keeps the
// current data), or pending again if a user resubmitted it meanwhile. Same
// errors as Update.
func (j *Job) Finish(ctx context.Context, data []byte) error {
	return j.transact(ctx, "finish", func(tx kv.Tx) error { return j.FinishTx(tx, data) })
}

// FinishTx is Finish inside the caller's transaction.
func (j *Job) FinishTx(tx kv.Tx, data []byte) error {
	return j.workerCall(tx, data, func(rec *messages.JobRecord, now time.Time) error {
		if err := j.unlock(tx, rec); err != nil {
			return err
		}
		if rec.GetResubmitRequested() {
			rec.ResubmitRequested = false
			rec.State = messages.JobState_JOB_STATE_PENDING
			j.q.enqueue(tx, rec, now)
		} else {
			rec.State = messages.JobState_JOB_STATE_FINISHED
			rec.FinishedAt = timeTS(now)
		}
		return j.q.storeRecord(tx, rec)
	})
}

// Resubmit ends the run and puts the job back in the pending queue, to be
// accepted again no earlier than opts.ScheduledAt (with opts' priority), for
// instance after a crash (backoff) or to make room for other jobs. data
// replaces the job's data unless nil. Same errors as Update.
func (j *Job) Resubmit(ctx context.Context, data []byte, opts ResubmitOptions) error {
	return j.transact(ctx, "resubmit", func(tx kv.Tx) error { return j.ResubmitTx(tx, data, opts) })
}

// ResubmitTx is Resubmit inside the caller's transaction.
func (j *Job) ResubmitTx(tx kv.Tx, data []byte, opts ResubmitOptions) error {
	return j.workerCall(tx, data, func(rec *messages.JobRecord, now time.Time) error {
		if err := j.unlock(tx, rec); err != nil {
			return err
		}
		rec.ResubmitRequested = false
		rec.State = messages.JobState_JOB_STATE_PENDING
		applyResubmit(rec, opts, now)
		j.q.enqueue(tx, rec, now)
		return j.q.storeRecord(tx, rec)
	})
}

func (j *Job) transact(ctx context.Context, op string, fn func(kv.Tx) error) error {
	var callErr error
	err := j.q.db.Transact(ctx, func(tx kv.Tx) error {
		callErr = fn(tx)
		if errors.Is(callErr, ErrCanceled) {
			// Commit the transition to finished (canceled), if any.
			return nil
		}
		return callErr
	})
	if err == nil {
		err = callErr
	}
	return wrapOp(op, j.typ, j.id, err)
}
