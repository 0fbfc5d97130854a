package jobqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/messages"
)

// AddOptions describes a new job.
type AddOptions struct {
	// Priority orders the pending queue: lower is accepted first.
	Priority uint64
	// ScheduledAt is the earliest time the job may be accepted; zero means now.
	ScheduledAt time.Time
	// Data is the type-specific payload.
	Data []byte
	// Replace makes Add redefine an existing job instead of failing with
	// ErrExists: the job becomes pending with the new priority, time and
	// data, its cancel and resubmit flags cleared. If it was running, its
	// worker loses the lock (its next call returns ErrWorkerConflict).
	Replace bool
	// Finished adds the job as already finished: it is never accepted.
	// Users keep such a record to show something that will not run, such
	// as a replication document that failed validation.
	Finished bool
}

// Add adds job (typ, id) as pending. It fails with ErrExists if the id is
// in use, unless opts.Replace is set.
func (q *Queue) Add(ctx context.Context, typ, id string, opts AddOptions) error {
	return q.transact(ctx, "add", typ, id, func(tx kv.Tx) error { return q.AddTx(tx, typ, id, opts) })
}

// AddTx is Add inside the caller's transaction.
func (q *Queue) AddTx(tx kv.Tx, typ, id string, opts AddOptions) error {
	if err := q.checkArgs(tx, typ, id); err != nil {
		return err
	}
	now := q.clock()
	old, err := q.loadRecord(tx, typ, id)
	switch {
	case errors.Is(err, ErrCorrupt) && opts.Replace:
		q.log.Warn().Err(err).Str("type", typ).Str("job", id).Msg("replacing corrupt job record")
		tx.Clear(q.keys.corruptKey(typ, id))
		old = nil
	case errors.Is(err, ErrCorrupt):
		return fmt.Errorf("%w (and %w)", ErrExists, err)
	case err != nil:
		return err
	case old != nil && !opts.Replace:
		return fmt.Errorf("%w: %q/%q", ErrExists, typ, id)
	}
	sched := opts.ScheduledAt
	if sched.IsZero() {
		sched = now
	}
	rec := &messages.JobRecord{Id: id, Type: typ, CreatedAt: timeTS(now)}
	if old != nil {
		if err := q.retire(tx, old); err != nil {
			return err
		}
		rec.Version = old.GetVersion()
		rec.CreatedAt = old.GetCreatedAt()
		rec.AcceptCount = old.GetAcceptCount()
		rec.TimeoutCount = old.GetTimeoutCount()
	}
	rec.State = messages.JobState_JOB_STATE_PENDING
	rec.Priority = opts.Priority
	rec.ScheduledAt = timeTS(sched)
	rec.Data = opts.Data
	rec.UpdatedAt = timeTS(now)
	if opts.Finished {
		rec.State = messages.JobState_JOB_STATE_FINISHED
		rec.FinishedAt = timeTS(now)
		return q.storeRecord(tx, rec)
	}
	q.enqueue(tx, rec, now)
	return q.storeRecord(tx, rec)
}

// retire removes old's index entries (pending or activity) before it is
// rewritten or deleted.
func (q *Queue) retire(tx kv.Tx, old *messages.JobRecord) error {
	switch old.GetState() {
	case messages.JobState_JOB_STATE_PENDING:
		q.dequeue(tx, old)
	case messages.JobState_JOB_STATE_RUNNING:
		q.clearActivity(tx, old)
		// The job leaves its lease (if any), whose holder learns it at its
		// next renewal.
		return q.removeFromLease(tx, old.GetType(), old.GetId())
	}
	return nil
}

// Get returns the job (typ, id).
func (q *Queue) Get(ctx context.Context, typ, id string) (*JobInfo, error) {
	var info *JobInfo
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		var err error
		info, err = q.GetTx(tx, typ, id)
		return err
	})
	if err != nil {
		return nil, wrapOp("get", typ, id, err)
	}
	return info, nil
}

// GetTx is Get inside the caller's transaction (the read adds a conflict).
func (q *Queue) GetTx(tx kv.ReadTx, typ, id string) (*JobInfo, error) {
	rec, err := q.existing(tx, typ, id)
	if err != nil {
		return nil, err
	}
	return infoFromRecord(rec), nil
}

// Remove deletes the job (typ, id) and its queue entries. A running job is
// stopped: its worker's next call returns ErrCanceled.
func (q *Queue) Remove(ctx context.Context, typ, id string) error {
	return q.transact(ctx, "remove", typ, id, func(tx kv.Tx) error { return q.RemoveTx(tx, typ, id) })
}

// RemoveTx is Remove inside the caller's transaction.
func (q *Queue) RemoveTx(tx kv.Tx, typ, id string) error {
	if err := q.checkArgs(tx, typ, id); err != nil {
		return err
	}
	rec, err := q.loadRecord(tx, typ, id)
	switch {
	case errors.Is(err, ErrCorrupt):
		// Its index entries cannot be found; Accept and the monitor drop
		// entries whose record is missing.
		q.log.Warn().Err(err).Str("type", typ).Str("job", id).Msg("removing corrupt job record")
		tx.Clear(q.keys.corruptKey(typ, id))
	case err != nil:
		return err
	case rec == nil:
		return fmt.Errorf("%w: %q/%q", ErrNotFound, typ, id)
	default:
		if err := q.retire(tx, rec); err != nil {
			return err
		}
	}
	tx.Clear(q.keys.dataKey(typ, id))
	q.bumpGeneration(tx, typ, id)
	return nil
}

// ResubmitOptions says when and where a job runs again. Zero values keep
// the job's priority and mean "now".
type ResubmitOptions struct {
	// ScheduledAt is the earliest time the job may be accepted again.
	ScheduledAt time.Time
	// Priority, if SetPriority, replaces the job's priority.
	Priority    uint64
	SetPriority bool
	// Data, if not nil, replaces the job's payload (Queue.ResubmitTx of a
	// job that does not run: a running job's worker owns its payload, and
	// ResubmitTx fails with ErrRunning).
	Data []byte
}

// Resubmit asks for job (typ, id) to run again: a finished job becomes
// pending; a pending job is rescheduled; a running job keeps running but
// goes back to pending when its worker finishes it.
func (q *Queue) Resubmit(ctx context.Context, typ, id string, opts ResubmitOptions) error {
	return q.transact(ctx, "resubmit", typ, id, func(tx kv.Tx) error { return q.ResubmitTx(tx, typ, id, opts) })
}

// ResubmitTx is Resubmit inside the caller's transaction.
func (q *Queue) ResubmitTx(tx kv.Tx, typ, id string, opts ResubmitOptions) error {
	rec, err := q.existing(tx, typ, id)
	if err != nil {
		return err
	}
	now := q.clock()
	if opts.Data != nil {
		if rec.GetState() == messages.JobState_JOB_STATE_RUNNING {
			return fmt.Errorf("%w: %q/%q: its worker owns its data", ErrRunning, typ, id)
		}
		rec.Data = opts.Data
	}
	if rec.GetState() == messages.JobState_JOB_STATE_PENDING {
		q.dequeue(tx, rec)
	}
	applyResubmit(rec, opts, now)
	rec.UpdatedAt = timeTS(now)
	if rec.GetState() == messages.JobState_JOB_STATE_RUNNING {
		// A user's request is not worker activity: keep the stamp.
		rec.ResubmitRequested = true
		return q.storeKeepStamp(tx, rec)
	}
	rec.State = messages.JobState_JOB_STATE_PENDING
	rec.CancelRequested = false
	rec.Canceled = false
	rec.FinishedAt = nil
	q.enqueue(tx, rec, now)
	return q.storeRecord(tx, rec)
}

func applyResubmit(rec *messages.JobRecord, opts ResubmitOptions, now time.Time) {
	sched := opts.ScheduledAt
	if sched.IsZero() {
		sched = now
	}
	rec.ScheduledAt = timeTS(sched)
	if opts.SetPriority {
		rec.Priority = opts.Priority
	}
}

// Cancel asks job (typ, id) to stop. A pending job finishes at once (as
// canceled); a running job is flagged, and its worker's next Update, Finish
// or Resubmit finishes it as canceled and returns ErrCanceled. Canceling a
// finished job does nothing.
func (q *Queue) Cancel(ctx context.Context, typ, id string) error {
	return q.transact(ctx, "cancel", typ, id, func(tx kv.Tx) error { return q.CancelTx(tx, typ, id) })
}

// CancelTx is Cancel inside the caller's transaction.
func (q *Queue) CancelTx(tx kv.Tx, typ, id string) error {
	rec, err := q.existing(tx, typ, id)
	if err != nil {
		return err
	}
	now := q.clock()
	switch rec.GetState() {
	case messages.JobState_JOB_STATE_PENDING:
		q.dequeue(tx, rec)
		rec.State = messages.JobState_JOB_STATE_FINISHED
		rec.CancelRequested = true
		rec.Canceled = true
		rec.FinishedAt = timeTS(now)
	case messages.JobState_JOB_STATE_RUNNING:
		if rec.GetCancelRequested() {
			return nil
		}
		rec.CancelRequested = true
		rec.UpdatedAt = timeTS(now)
		if err := q.kick(tx, typ, id); err != nil {
			return err
		}
		return q.storeKeepStamp(tx, rec)
	default:
		return nil
	}
	rec.UpdatedAt = timeTS(now)
	return q.storeRecord(tx, rec)
}

// Generation is a number that changes whenever a record of a job of typ is
// written or removed (every write of a record bumps one of the type's
// counter shards; it never decreases): a reader that listed the jobs
// after reading generation g and finds g again later knows its listing is
// still current. Records written by a process older than this counter do
// not bump it: keep a listing only for a bounded time.
func (q *Queue) Generation(ctx context.Context, typ string) (int64, error) {
	var g int64
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		g = 0
		begin, end := q.keys.generation.Sub(typ).Range()
		it := tx.Snapshot().GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			g += kv.Int64LE(it.KeyValue().Value)
		}
		return it.Err()
	})
	if err != nil {
		return 0, fmt.Errorf("jobqueue: generation of %q: %w", typ, err)
	}
	return g, nil
}

// GenerationShardsOf reads the generation counter of typ shard by shard
// (GenerationShard: shard → value; shards never written are absent), in
// one read of at most GenerationShards keys: a reader that listed the jobs
// after reading it re-reads, when it changes, only the jobs of the shards
// whose value moved (and the jobs added meanwhile). Generation is their
// sum.
func (q *Queue) GenerationShardsOf(ctx context.Context, typ string) (map[int64]int64, error) {
	out := map[int64]int64{}
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		clear(out)
		sub := q.keys.generation.Sub(typ)
		begin, end := sub.Range()
		it := tx.Snapshot().GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			t, err := sub.Unpack(it.KeyValue().Key)
			if err != nil || len(t) != 1 {
				continue
			}
			if shard, ok := t[0].(int64); ok {
				out[shard] += kv.Int64LE(it.KeyValue().Value)
			}
		}
		return it.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("jobqueue: generation shards of %q: %w", typ, err)
	}
	return out, nil
}

// JobNodes is RunningByNode by job: every job of typ, with its worker node
// while it runs ("" when it does not), from one read transaction.
func (q *Queue) JobNodes(ctx context.Context, typ string) (map[string]string, error) {
	out := map[string]string{}
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		clear(out)
		if err := q.checkType(tx, typ); err != nil {
			return err
		}
		sub := q.keys.data.Sub(typ)
		begin, end := sub.Range()
		it := tx.GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			t, err := sub.Unpack(it.KeyValue().Key)
			if err != nil || len(t) != 1 {
				continue
			}
			id, _ := t[0].(string)
			node, running := runningNode(it.KeyValue().Value)
			if !running {
				node = ""
			}
			out[id] = node
		}
		return it.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("jobqueue: nodes of %q jobs: %w", typ, err)
	}
	return out, nil
}

// JobNodesOf is JobNodes for the jobs ids (those that do not exist are
// absent), in one transaction.
func (q *Queue) JobNodesOf(ctx context.Context, typ string, ids []string) (map[string]string, error) {
	out := make(map[string]string, len(ids))
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		clear(out)
		keys := make([][]byte, len(ids))
		for i, id := range ids {
			keys[i] = q.keys.dataKey(typ, id)
		}
		vals, err := kv.GetMany(tx, keys)
		if err != nil {
			return err
		}
		for i, v := range vals {
			if v != nil {
				node, running := runningNode(v)
				if !running {
					node = ""
				}
				out[ids[i]] = node
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("jobqueue: nodes of %q jobs: %w", typ, err)
	}
	return out, nil
}

// RunningByNode counts the running jobs of typ per worker node, from one
// read transaction. It reads of each record only its state and worker node
// (the protobuf fields, not a decode of the record and its data): what a
// view of the cluster's nodes shows, at a fraction of a Fold. Records that
// cannot be read so are not counted.
func (q *Queue) RunningByNode(ctx context.Context, typ string) (map[string]int, error) {
	out := map[string]int{}
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		clear(out)
		if err := q.checkType(tx, typ); err != nil {
			return err
		}
		begin, end := q.keys.dataRange(typ)
		it := tx.GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			if node, running := runningNode(it.KeyValue().Value); running {
				out[node]++
			}
		}
		return it.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("jobqueue: running jobs of %q: %w", typ, err)
	}
	return out, nil
}

// runningNode reads an encoded JobRecord's state and worker node
// (fields 4 and 9) without decoding the rest.
func runningNode(b []byte) (node string, running bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", false
		}
		b = b[n:]
		switch {
		case num == 4 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return "", false
			}
			running = v == uint64(messages.JobState_JOB_STATE_RUNNING)
			n = m
		case num == 9 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", false
			}
			node = string(v)
			n = m
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return "", false
			}
		}
		b = b[n:]
	}
	return node, running
}

// Fold calls fn for every job of typ, in id order, in one read transaction.
// fn returning an error stops the fold with that error. Records that fail
// to decode are not passed to fn; they are reported together (wrapping
// ErrCorrupt) after every other job was visited.
func (q *Queue) Fold(ctx context.Context, typ string, fn func(*JobInfo) error) error {
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		if err := q.checkType(tx, typ); err != nil {
			return err
		}
		var corrupt []error
		begin, end := q.keys.dataRange(typ)
		it := tx.GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			e := it.KeyValue()
			t, err := q.keys.data.Unpack(e.Key)
			if err != nil || len(t) != 2 {
				corrupt = append(corrupt, fmt.Errorf("%w: bad job key %x", ErrCorrupt, e.Key))
				continue
			}
			id, _ := t[1].(string)
			rec, err := decodeRecord(typ, id, e.Value)
			if err != nil {
				corrupt = append(corrupt, err)
				continue
			}
			if err := fn(infoFromRecord(rec)); err != nil {
				return err
			}
		}
		if err := it.Err(); err != nil {
			return err
		}
		return errors.Join(corrupt...)
	})
	if err != nil {
		return fmt.Errorf("jobqueue: fold %q: %w", typ, err)
	}
	return nil
}

// PendingCount returns how many jobs of typ are pending and due now, up to
// limit (0 = no limit), from a snapshot (no conflicts).
func (q *Queue) PendingCount(ctx context.Context, typ string, limit int) (int, error) {
	n := 0
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		if err := q.checkType(tx, typ); err != nil {
			return err
		}
		n = 0
		snap := tx.Snapshot()
		count := func(begin, end []byte) error {
			it := snap.GetRange(begin, end, kv.RangeOptions{Limit: max(0, limit-n)})
			for it.Next() {
				n++
			}
			return it.Err()
		}
		if err := count(q.keys.readyRange(typ, ^uint64(0))); err != nil {
			return err
		}
		if limit > 0 && n >= limit {
			return nil
		}
		return count(q.keys.delayedRange(typ, q.clock()))
	})
	if err != nil {
		return 0, fmt.Errorf("jobqueue: pending count %q: %w", typ, err)
	}
	return n, nil
}

// WaitChange blocks until job (typ, id) has a version greater than after
// (see JobInfo.Version) and returns it; with after = 0 it returns at once.
// It waits on a kv watch of the job's record, not by polling. A job that is
// (or becomes) absent gives ErrNotFound.
func (q *Queue) WaitChange(ctx context.Context, typ, id string, after uint64) (*JobInfo, error) {
	for {
		var (
			info *JobInfo
			w    kv.Watch
		)
		err := q.db.Transact(ctx, func(tx kv.Tx) error {
			if w != nil { // from an attempt that did not commit
				w.Cancel()
			}
			info, w = nil, nil
			var err error
			if info, err = q.GetTx(tx, typ, id); err != nil {
				return err
			}
			if info.Version <= after {
				w = tx.Watch(q.keys.dataKey(typ, id))
			}
			return nil
		})
		if err != nil {
			return nil, wrapOp("wait", typ, id, err)
		}
		if w == nil {
			return info, nil
		}
		err = w.Wait(ctx)
		w.Cancel()
		if err != nil {
			return nil, wrapOp("wait", typ, id, err)
		}
	}
}

// WaitState blocks until job (typ, id) is in one of states and returns it.
func (q *Queue) WaitState(ctx context.Context, typ, id string, states ...State) (*JobInfo, error) {
	var after uint64
	for {
		info, err := q.WaitChange(ctx, typ, id, after)
		if err != nil {
			return nil, err
		}
		for _, s := range states {
			if info.State == s {
				return info, nil
			}
		}
		after = info.Version
	}
}

// existing checks the arguments and reads job (typ, id), which must exist
// (else ErrNotFound).
func (q *Queue) existing(tx kv.ReadTx, typ, id string) (*messages.JobRecord, error) {
	if err := q.checkArgs(tx, typ, id); err != nil {
		return nil, err
	}
	rec, err := q.loadRecord(tx, typ, id)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, fmt.Errorf("%w: %q/%q", ErrNotFound, typ, id)
	}
	return rec, nil
}

func (q *Queue) checkArgs(tx kv.ReadTx, typ, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	return q.checkType(tx, typ)
}

func (q *Queue) transact(ctx context.Context, op, typ, id string, fn func(kv.Tx) error) error {
	return wrapOp(op, typ, id, q.db.Transact(ctx, fn))
}

func wrapOp(op, typ, id string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("jobqueue: %s %q/%.64q: %w", op, typ, id, err)
}
