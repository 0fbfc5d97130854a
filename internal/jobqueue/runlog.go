package jobqueue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// ErrRunOverlap is returned (wrapped) by CheckRuns when two runs of one job
// overlap in commit order: a worker committed under its lock after another
// worker had accepted the job.
var ErrRunOverlap = errors.New("jobqueue: runs of a job overlap")

// The run log (Options.RunLog) records every run of every job: the commit
// that accepted it and the last commit its worker made under its lock. Both
// are versionstamps, so they order runs by commit order across every process
// sharing the store, independent of clocks. Keys, under the queue's root:
//
//	(tagRunLog, type, id, lock, runStart) = start stamp (10 bytes) ++ node name
//	(tagRunLog, type, id, lock, runEnd)   = end stamp (10 bytes)
//
// Both are written in the lock-checked transactions themselves (Accept, and
// every Update/Finish/Resubmit and their Tx variants), so a run's end stamp
// is exactly the commit order of its worker's last successful write.
const (
	tagRunLog = 9
	runStart  = 0
	runEnd    = 1
)

// Run is one run of a job as the run log recorded it.
type Run struct {
	Type, ID string
	// Node is the node that accepted the job.
	Node string
	// Lock is the worker lock of the run.
	Lock []byte
	// Start is the versionstamp of the Accept commit; End that of the last
	// commit the worker made under Lock (Start if it made none).
	Start, End [kv.VersionstampLength]byte
}

func (k keys) runLog() tuple.Subspace { return k.root.Sub(tagRunLog) }

// markRun records, in tx, a commit under lock: the start of the run too if
// start is set.
func (q *Queue) markRun(tx kv.Tx, typ, id string, lock []byte, start bool) error {
	if !q.runLog {
		return nil
	}
	sub := q.keys.runLog()
	stamp := make([]byte, kv.VersionstampLength)
	if start {
		if err := tx.SetVersionstampedValue(sub.Pack(tuple.Tuple{typ, id, lock, runStart}), append(stamp, q.node...), 0); err != nil {
			return fmt.Errorf("jobqueue: run log: %w", err)
		}
	}
	if err := tx.SetVersionstampedValue(sub.Pack(tuple.Tuple{typ, id, lock, runEnd}), stamp, 0); err != nil {
		return fmt.Errorf("jobqueue: run log: %w", err)
	}
	return nil
}

// Runs returns the recorded runs of every job of typ, each job's runs in
// commit order of their starts. It is empty unless the workers ran with
// Options.RunLog.
func (q *Queue) Runs(ctx context.Context, typ string) (map[string][]Run, error) {
	out := map[string][]Run{}
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		clear(out)
		sub := q.keys.runLog().Sub(typ)
		begin, end := sub.Range()
		byLock := map[string]*Run{}
		it := tx.GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			e := it.KeyValue()
			t, err := sub.Unpack(e.Key)
			if err != nil || len(t) != 3 || len(e.Value) < kv.VersionstampLength {
				return fmt.Errorf("%w: bad run log entry %x", ErrCorrupt, e.Key)
			}
			id, ok1 := t[0].(string)
			lock, ok2 := t[1].([]byte)
			kind, ok3 := t[2].(int64)
			if !ok1 || !ok2 || !ok3 {
				return fmt.Errorf("%w: bad run log key %x", ErrCorrupt, e.Key)
			}
			lk := id + "\x00" + string(lock)
			r := byLock[lk]
			if r == nil {
				r = &Run{Type: typ, ID: id, Lock: bytes.Clone(lock)}
				byLock[lk] = r
			}
			stamp := [kv.VersionstampLength]byte(e.Value[:kv.VersionstampLength])
			if kind == runStart {
				r.Start, r.Node = stamp, string(e.Value[kv.VersionstampLength:])
			} else {
				r.End = stamp
			}
		}
		if err := it.Err(); err != nil {
			return err
		}
		for _, r := range byLock {
			out[r.ID] = append(out[r.ID], *r)
		}
		for id := range out {
			slices.SortFunc(out[id], func(a, b Run) int { return bytes.Compare(a.Start[:], b.Start[:]) })
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("jobqueue: read run log of %q: %w", typ, err)
	}
	return out, nil
}

// CheckRuns proves that the runs of one job (sorted by Start, as Runs
// returns them) never overlapped in commit order: each run started, and
// ended, before the next one started. A run with no recorded start (its
// accept was not logged) is an error too.
func CheckRuns(runs []Run) error {
	var errs []error
	var zero [kv.VersionstampLength]byte
	for i, r := range runs {
		if r.Start == zero {
			errs = append(errs, fmt.Errorf("%w: job %s: run with lock %x has no start", ErrRunOverlap, r.ID, r.Lock))
			continue
		}
		if bytes.Compare(r.End[:], r.Start[:]) < 0 {
			errs = append(errs, fmt.Errorf("%w: job %s: run %x on %s ends before it starts", ErrRunOverlap, r.ID, r.Lock, r.Node))
		}
		if i+1 < len(runs) && bytes.Compare(r.End[:], runs[i+1].Start[:]) >= 0 {
			next := runs[i+1]
			errs = append(errs, fmt.Errorf("%w: job %s: run %x on %s committed at %x, after run %x on %s started at %x",
				ErrRunOverlap, r.ID, r.Lock, r.Node, r.End, next.Lock, next.Node, next.Start))
		}
	}
	return errors.Join(errs...)
}
