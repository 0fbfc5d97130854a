package repjob

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/messages"
)

// ErrNotRunning is returned (wrapped) by RequestControl for a job that does
// not run.
var ErrNotRunning = errors.New("repjob: job not running")

// controlPoll bounds how long WaitControl trusts its watch alone: a request
// also ends when its run ends without the target clearing it (a node that
// died), which only a fresh read notices.
const controlPoll = time.Second

// RequestControl asks the node running job jobID to carry out action (stop
// or restart) and returns the request, for WaitControl. A request already
// pending for the same run is returned instead of a new one. It fails with
// an error wrapping ErrNotFound or ErrNotRunning.
func (s *Store) RequestControl(ctx context.Context, jobID string, action messages.JobControl_Action, by string) (*messages.JobControl, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	var c *messages.JobControl
	err := s.db.Transact(ctx, func(tx kv.Tx) error {
		info, err := s.q.GetTx(tx, JobType, jobID)
		if err != nil {
			return err
		}
		if info.State != jobqueue.StateRunning {
			return fmt.Errorf("%w: %s", ErrNotRunning, info.State)
		}
		c, err = s.addControl(tx, info, action, by)
		return err
	})
	if err != nil {
		return nil, wrapNotFound("control", jobID, err)
	}
	return c, nil
}

// Cancel cancels transient job jobID: it is removed and, if it runs, the
// same transaction asks its node to stop it now (the request is returned,
// for WaitControl; else nil): its worker would otherwise notice only at its
// next write. A persistent job is not canceled: it follows its _replicator
// document, which alone can end it (deleted or changed), as in CouchDB; the
// error wraps ErrDocumentJob and nothing changes. (Cancel once flagged such
// a job canceled in the queue while its record still said running: a job
// nobody ran that every view showed running.)
func (s *Store) Cancel(ctx context.Context, jobID, by string) (*messages.JobControl, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	var c *messages.JobControl
	err := s.db.Transact(ctx, func(tx kv.Tx) error {
		c = nil
		info, err := s.q.GetTx(tx, JobType, jobID)
		if err != nil {
			return err
		}
		rec, err := recordFromInfo(info)
		if err != nil {
			return err
		}
		if rec.Kind == messages.ReplicationKind_REPLICATION_KIND_PERSISTENT {
			return fmt.Errorf("%w: document %q of %s on %s", ErrDocumentJob, rec.GetDocId(), rec.GetDbName(), rec.GetServer())
		}
		c, err = s.removeTx(tx, info, by)
		return err
	})
	if err != nil {
		return nil, wrapNotFound("cancel", jobID, err)
	}
	return c, nil
}

// stopRunTx asks the node running job info (if it runs) to stop that run
// now, in the caller's transaction, which removes or replaces the job: its
// actor would otherwise run on until its next write to the store found the
// job gone (jobqueue.ErrCanceled) or taken (jobqueue.ErrWorkerConflict),
// while no view showed it. It returns the request, or nil.
func (s *Store) stopRunTx(tx kv.Tx, info *jobqueue.JobInfo, by string) (*messages.JobControl, error) {
	if info.State != jobqueue.StateRunning {
		return nil, nil
	}
	return s.addControl(tx, info, messages.JobControl_ACTION_CANCEL, by)
}

// addControl writes a request for the running job info (or returns the one
// pending for the same run) and wakes its node's job server.
func (s *Store) addControl(tx kv.Tx, info *jobqueue.JobInfo, action messages.JobControl_Action, by string) (*messages.JobControl, error) {
	key := s.k.controlKey(info.WorkerNode, info.ID)
	old, err := s.readControl(tx, key)
	if err != nil {
		return nil, err
	}
	if old != nil && old.GetRun() == info.AcceptCount {
		if action != messages.JobControl_ACTION_CANCEL || old.GetAction() == action {
			return old, nil
		}
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	c := &messages.JobControl{JobId: info.ID, Action: action, Node: info.WorkerNode, Run: info.AcceptCount,
		RequestedBy: by, RequestedAt: timestamppb.New(s.now()), Id: hex.EncodeToString(id[:])}
	b, err := proto.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("repjob: encode control of %q: %w", info.ID, err)
	}
	tx.Set(key, b)
	tx.Add(s.k.controlWatchKey(info.WorkerNode), 1)
	return c, nil
}

func (s *Store) readControl(tx kv.ReadTx, key []byte) (*messages.JobControl, error) {
	v, err := tx.Get(key)
	if err != nil || v == nil {
		return nil, err
	}
	c := &messages.JobControl{}
	if err := proto.Unmarshal(v, c); err != nil {
		return nil, fmt.Errorf("repjob: decode control %x: %w", key, err)
	}
	return c, nil
}

// Controls returns the requests addressed to node, and a watch that fires
// when a new one arrives (the caller must Cancel it).
func (s *Store) Controls(ctx context.Context, node string) ([]*messages.JobControl, kv.Watch, error) {
	if err := s.Init(ctx); err != nil {
		return nil, nil, err
	}
	var out []*messages.JobControl
	var w kv.Watch
	err := s.db.Transact(ctx, func(tx kv.Tx) error {
		out = out[:0]
		begin, end := s.k.control.Sub(node).Range()
		it := tx.GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			c := &messages.JobControl{}
			if err := proto.Unmarshal(it.KeyValue().Value, c); err != nil {
				s.log.Warn().Err(err).Msg("repjob: dropping undecodable control request")
				tx.Clear(bytes.Clone(it.KeyValue().Key))
				continue
			}
			out = append(out, c)
		}
		if err := it.Err(); err != nil {
			return err
		}
		w = tx.Watch(s.k.controlWatchKey(node))
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("repjob: read control requests of %q: %w", node, err)
	}
	return out, w, nil
}

// ClearControl removes request c, if it is still the pending one: it was
// carried out, or found stale.
func (s *Store) ClearControl(ctx context.Context, c *messages.JobControl) error {
	err := s.db.Transact(ctx, func(tx kv.Tx) error {
		key := s.k.controlKey(c.GetNode(), c.GetJobId())
		cur, err := s.readControl(tx, key)
		if err != nil {
			return err
		}
		if cur != nil && cur.GetId() == c.GetId() {
			tx.Clear(key)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("repjob: clear control of %q: %w", c.GetJobId(), err)
	}
	return nil
}

// WaitControl blocks until request c was carried out (its node cleared
// it), or its run ended otherwise (then it clears the stale request), or
// ctx ends.
func (s *Store) WaitControl(ctx context.Context, c *messages.JobControl) error {
	key := s.k.controlKey(c.GetNode(), c.GetJobId())
	for {
		var w kv.Watch
		var done bool
		err := s.db.Transact(ctx, func(tx kv.Tx) error {
			w, done = nil, false
			cur, err := s.readControl(tx, key)
			if err != nil {
				return err
			}
			if cur == nil || cur.GetId() != c.GetId() {
				done = true
				return nil
			}
			if stale, err := s.staleTx(tx, cur); err != nil || stale {
				done = stale
				if stale {
					tx.Clear(key)
				}
				return err
			}
			w = tx.Watch(key)
			return nil
		})
		if err != nil {
			return fmt.Errorf("repjob: wait for control of %q: %w", c.GetJobId(), err)
		}
		if done {
			return nil
		}
		wctx, cancel := context.WithTimeout(ctx, controlPoll)
		err = w.Wait(wctx)
		cancel()
		w.Cancel()
		if ctx.Err() != nil {
			return fmt.Errorf("repjob: wait for control of %q: %w", c.GetJobId(), ctx.Err())
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("repjob: wait for control of %q: %w", c.GetJobId(), err)
		}
	}
}

// Stale reports whether request c outlived its run: the job no longer
// runs on c's node in c's run. A cancel request (its job is already gone or
// canceled in the store) is stale only after the activity timeout: by then
// its worker noticed the cancellation at a write of its own.
func (s *Store) Stale(ctx context.Context, c *messages.JobControl) (bool, error) {
	var stale bool
	err := s.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		var err error
		stale, err = s.staleTx(tx, c)
		return err
	})
	return stale, err
}

func (s *Store) staleTx(tx kv.ReadTx, c *messages.JobControl) (bool, error) {
	if c.GetAction() == messages.JobControl_ACTION_CANCEL {
		return s.now().Sub(c.GetRequestedAt().AsTime()) > s.timeout, nil
	}
	info, err := s.q.GetTx(tx, JobType, c.GetJobId())
	if errors.Is(err, jobqueue.ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return info.State != jobqueue.StateRunning || info.WorkerNode != c.GetNode() || info.AcceptCount != c.GetRun(), nil
}

// CleanupControls removes stale requests (their run ended without their
// node clearing them: a node that died) and returns how many. Requests are
// few: one per pending operator request.
func (s *Store) CleanupControls(ctx context.Context) (int, error) {
	if err := s.Init(ctx); err != nil {
		return 0, err
	}
	n := 0
	err := s.db.Transact(ctx, func(tx kv.Tx) error {
		begin, end := s.k.control.Range()
		var err error
		n, err = kv.ClearWhere(tx, begin, end, kv.RangeOptions{Limit: 1000}, func(e kv.KeyValue) (bool, error) {
			c := &messages.JobControl{}
			if err := proto.Unmarshal(e.Value, c); err != nil {
				return true, nil
			}
			return s.staleTx(tx, c)
		})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("repjob: clean up control requests: %w", err)
	}
	return n, nil
}

// Generation is the run's number among the job's runs (the queue's accept
// count): what a control request for this run names.
func (r *Run) Generation() uint64 { return r.j.Info().AcceptCount }
