package jobqueue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/storetest"
)

func TestMain(m *testing.M) {
	if isHelperProcess() {
		helperMain()
		return
	}
	code := m.Run()
	closeBenchStores()
	storetest.Stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// fakeClock is a settable clock for scheduled-time tests.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type bundle struct {
	db    kv.Database
	q     *Queue
	clock *fakeClock
	ctx   context.Context
}

const typA = "rep_jobs"

// setup returns a queue on a fresh store of each backend under test, with
// type typA registered (timeout 1 minute) and a fake clock.
func setup(t *testing.T, opts Options) *bundle {
	t.Helper()
	db := openTestDB(t)
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	opts.Clock = clock.Now
	if opts.NodeName == "" {
		opts.NodeName = "node1"
	}
	q := New(db, opts)
	ctx := t.Context()
	if err := q.SetTypeTimeout(ctx, typA, time.Minute); err != nil {
		t.Fatal(err)
	}
	return &bundle{db: db, q: q, clock: clock, ctx: ctx}
}

func mustAdd(t *testing.T, b *bundle, id string, opts AddOptions) {
	t.Helper()
	if err := b.q.Add(b.ctx, typA, id, opts); err != nil {
		t.Fatalf("add %s: %v", id, err)
	}
}

func mustAccept(t *testing.T, b *bundle) *Job {
	t.Helper()
	j, err := b.q.Accept(b.ctx, typA, AcceptOptions{})
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	return j
}

func mustState(t *testing.T, b *bundle, id string, want State) *JobInfo {
	t.Helper()
	info, err := b.q.Get(b.ctx, typA, id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	if info.State != want {
		t.Fatalf("job %s: state %v, want %v", id, info.State, want)
	}
	return info
}

func TestBadInput(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		mustAdd(t, b, "dup", AddOptions{})
		long := strings.Repeat("x", MaxIDLength+1)
		tests := []struct {
			name string
			call func() error
			want error
		}{
			{"add unknown type", func() error { return b.q.Add(b.ctx, "nope", "a", AddOptions{}) }, ErrUnknownType},
			{"add empty type", func() error { return b.q.Add(b.ctx, "", "a", AddOptions{}) }, ErrUnknownType},
			{"accept unknown type", func() error { _, err := b.q.Accept(b.ctx, "nope", AcceptOptions{}); return err }, ErrUnknownType},
			{"get unknown type", func() error { _, err := b.q.Get(b.ctx, "nope", "a"); return err }, ErrUnknownType},
			{"fold unknown type", func() error { return b.q.Fold(b.ctx, "nope", func(*JobInfo) error { return nil }) }, ErrUnknownType},
			{"pending count unknown type", func() error { _, err := b.q.PendingCount(b.ctx, "nope", 0); return err }, ErrUnknownType},
			{"add empty id", func() error { return b.q.Add(b.ctx, typA, "", AddOptions{}) }, ErrInvalidID},
			{"add oversized id", func() error { return b.q.Add(b.ctx, typA, long, AddOptions{}) }, ErrInvalidID},
			{"get oversized id", func() error { _, err := b.q.Get(b.ctx, typA, long); return err }, ErrInvalidID},
			{"remove empty id", func() error { return b.q.Remove(b.ctx, typA, "") }, ErrInvalidID},
			{"add duplicate", func() error { return b.q.Add(b.ctx, typA, "dup", AddOptions{}) }, ErrExists},
			{"get missing", func() error { _, err := b.q.Get(b.ctx, typA, "missing"); return err }, ErrNotFound},
			{"remove missing", func() error { return b.q.Remove(b.ctx, typA, "missing") }, ErrNotFound},
			{"cancel missing", func() error { return b.q.Cancel(b.ctx, typA, "missing") }, ErrNotFound},
			{"resubmit missing", func() error { return b.q.Resubmit(b.ctx, typA, "missing", ResubmitOptions{}) }, ErrNotFound},
			{"bad timeout", func() error { return b.q.SetTypeTimeout(b.ctx, "t", 0) }, nil},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				err := tt.call()
				if err == nil {
					t.Fatalf("want error %v, got nil", tt.want)
				}
				if tt.want != nil && !errors.Is(err, tt.want) {
					t.Fatalf("got %v, want %v", err, tt.want)
				}
			})
		}
		// Exactly MaxIDLength bytes is fine.
		mustAdd(t, b, strings.Repeat("y", MaxIDLength), AddOptions{})
	})
}

func TestLifecycle(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		mustAdd(t, b, "j1", AddOptions{Data: []byte("v0"), Priority: 7})
		info := mustState(t, b, "j1", StatePending)
		if string(info.Data) != "v0" || info.Priority != 7 || !info.ScheduledAt.Equal(b.clock.Now()) {
			t.Fatalf("pending info %+v", info)
		}
		if n, err := b.q.PendingCount(b.ctx, typA, 0); err != nil || n != 1 {
			t.Fatalf("pending count %d, %v", n, err)
		}
		j := mustAccept(t, b)
		if j.ID() != "j1" || j.Type() != typA || len(j.Lock()) != 16 {
			t.Fatalf("accepted %q %q lock %x", j.Type(), j.ID(), j.Lock())
		}
		info = mustState(t, b, "j1", StateRunning)
		if info.WorkerNode != "node1" || info.AcceptCount != 1 {
			t.Fatalf("running info %+v", info)
		}
		if n, _ := b.q.PendingCount(b.ctx, typA, 0); n != 0 {
			t.Fatalf("pending count %d after accept", n)
		}
		if _, err := b.q.Accept(b.ctx, typA, AcceptOptions{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second accept: %v", err)
		}
		if err := j.Update(b.ctx, []byte("v1")); err != nil {
			t.Fatal(err)
		}
		if got := mustState(t, b, "j1", StateRunning); string(got.Data) != "v1" {
			t.Fatalf("data %q", got.Data)
		}
		if err := j.Update(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		if err := j.Finish(b.ctx, []byte("done")); err != nil {
			t.Fatal(err)
		}
		if got := mustState(t, b, "j1", StateFinished); string(got.Data) != "done" || got.FinishedAt.IsZero() {
			t.Fatalf("finished info %+v", got)
		}
		// The lock is gone: every worker call is a conflict now.
		for name, call := range map[string]func() error{
			"update":   func() error { return j.Update(b.ctx, nil) },
			"finish":   func() error { return j.Finish(b.ctx, nil) },
			"resubmit": func() error { return j.Resubmit(b.ctx, nil, ResubmitOptions{}) },
		} {
			if err := call(); !errors.Is(err, ErrWorkerConflict) {
				t.Fatalf("%s after finish: %v", name, err)
			}
		}
		// Resubmitting a finished job makes it pending again.
		if err := b.q.Resubmit(b.ctx, typA, "j1", ResubmitOptions{}); err != nil {
			t.Fatal(err)
		}
		mustState(t, b, "j1", StatePending)
		if err := b.q.Remove(b.ctx, typA, "j1"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.q.Accept(b.ctx, typA, AcceptOptions{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("accept after remove: %v", err)
		}
	})
}

func TestAcceptOrder(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{AcceptSpread: 1})
		now := b.clock.Now()
		mustAdd(t, b, "p5", AddOptions{Priority: 5})
		mustAdd(t, b, "p1", AddOptions{Priority: 1})
		mustAdd(t, b, "p3", AddOptions{Priority: 3})
		mustAdd(t, b, "p0-later", AddOptions{Priority: 0, ScheduledAt: now.Add(time.Hour)})
		if n, _ := b.q.PendingCount(b.ctx, typA, 0); n != 3 {
			t.Fatalf("pending count %d, want 3 due", n)
		}
		// MaxPriority excludes p3 and p5.
		j, err := b.q.Accept(b.ctx, typA, AcceptOptions{MaxPriority: 2, HasMaxPriority: true})
		if err != nil || j.ID() != "p1" {
			t.Fatalf("accept max 2: %v %v", j, err)
		}
		if _, err := b.q.Accept(b.ctx, typA, AcceptOptions{MaxPriority: 2, HasMaxPriority: true}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("accept max 2 again: %v", err)
		}
		if j := mustAccept(t, b); j.ID() != "p3" {
			t.Fatalf("got %s want p3", j.ID())
		}
		b.clock.Advance(2 * time.Hour)
		if j := mustAccept(t, b); j.ID() != "p0-later" {
			t.Fatalf("got %s want p0-later once due", j.ID())
		}
		if j := mustAccept(t, b); j.ID() != "p5" {
			t.Fatalf("got %s want p5", j.ID())
		}
	})
}

func TestAcceptSpreadTakesAll(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{AcceptSpread: 4})
		const n = 20
		for i := range n {
			mustAdd(t, b, string(rune('a'+i)), AddOptions{Priority: uint64(i)})
		}
		seen := map[string]bool{}
		for range n {
			j := mustAccept(t, b)
			if seen[j.ID()] {
				t.Fatalf("%s accepted twice", j.ID())
			}
			seen[j.ID()] = true
			if err := j.Finish(b.ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.q.Accept(b.ctx, typA, AcceptOptions{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("queue not empty: %v", err)
		}
	})
}

func TestReplace(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		mustAdd(t, b, "j", AddOptions{Data: []byte("old")})
		old := mustAccept(t, b)
		if err := b.q.Add(b.ctx, typA, "j", AddOptions{Data: []byte("new"), Replace: true}); err != nil {
			t.Fatal(err)
		}
		if info := mustState(t, b, "j", StatePending); string(info.Data) != "new" {
			t.Fatalf("data %q", info.Data)
		}
		if err := old.Update(b.ctx, []byte("stale")); !errors.Is(err, ErrWorkerConflict) {
			t.Fatalf("old worker update: %v", err)
		}
		j := mustAccept(t, b)
		if string(j.Info().Data) != "new" {
			t.Fatalf("accepted data %q", j.Info().Data)
		}
	})
}

func TestCancel(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		mustAdd(t, b, "pending", AddOptions{})
		if err := b.q.Cancel(b.ctx, typA, "pending"); err != nil {
			t.Fatal(err)
		}
		if info := mustState(t, b, "pending", StateFinished); !info.Canceled {
			t.Fatalf("not canceled: %+v", info)
		}
		for _, call := range []string{"update", "finish", "resubmit"} {
			t.Run(call, func(t *testing.T) {
				id := "running-" + call
				mustAdd(t, b, id, AddOptions{})
				j := mustAccept(t, b)
				if err := b.q.Cancel(b.ctx, typA, id); err != nil {
					t.Fatal(err)
				}
				if info := mustState(t, b, id, StateRunning); !info.CancelRequested {
					t.Fatalf("cancel not requested: %+v", info)
				}
				var err error
				switch call {
				case "update":
					err = j.Update(b.ctx, nil)
				case "finish":
					err = j.Finish(b.ctx, nil)
				case "resubmit":
					err = j.Resubmit(b.ctx, nil, ResubmitOptions{})
				}
				if !errors.Is(err, ErrCanceled) {
					t.Fatalf("%s: %v", call, err)
				}
				if info := mustState(t, b, id, StateFinished); !info.Canceled {
					t.Fatalf("not finished as canceled: %+v", info)
				}
			})
		}
	})
}

func TestRemoveRunning(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		mustAdd(t, b, "j", AddOptions{})
		j := mustAccept(t, b)
		if err := b.q.Remove(b.ctx, typA, "j"); err != nil {
			t.Fatal(err)
		}
		if err := j.Update(b.ctx, nil); !errors.Is(err, ErrCanceled) {
			t.Fatalf("update of removed job: %v", err)
		}
		if _, err := b.q.Get(b.ctx, typA, "j"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get removed: %v", err)
		}
		// Nothing left for the monitor either.
		m := b.q.NewMonitor(MonitorOptions{})
		t0 := time.Now()
		for _, at := range []time.Time{t0, t0.Add(2 * time.Minute)} {
			if n, err := m.Check(b.ctx, at); err != nil || n != 0 {
				t.Fatalf("monitor: %d %v", n, err)
			}
		}
	})
}

func TestResubmit(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		mustAdd(t, b, "j", AddOptions{})
		j := mustAccept(t, b)
		// A user resubmits the running job: it finishes into pending.
		if err := b.q.Resubmit(b.ctx, typA, "j", ResubmitOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := j.Update(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		if !j.Info().ResubmitRequested {
			t.Fatal("worker does not see the resubmit request")
		}
		if err := j.Finish(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		mustState(t, b, "j", StatePending)
		// The worker resubmits with a backoff and a new priority.
		j = mustAccept(t, b)
		later := b.clock.Now().Add(time.Minute)
		if err := j.Resubmit(b.ctx, []byte("crashed"), ResubmitOptions{ScheduledAt: later, Priority: 9, SetPriority: true}); err != nil {
			t.Fatal(err)
		}
		info := mustState(t, b, "j", StatePending)
		if info.Priority != 9 || !info.ScheduledAt.Equal(later) || string(info.Data) != "crashed" {
			t.Fatalf("resubmitted info %+v", info)
		}
		if _, err := b.q.Accept(b.ctx, typA, AcceptOptions{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("accepted before its time: %v", err)
		}
		b.clock.Advance(time.Minute)
		if j := mustAccept(t, b); j.Info().AcceptCount != 3 {
			t.Fatalf("accept count %d", j.Info().AcceptCount)
		}
	})
}

func TestUpdateTxRollsBackWithCaller(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		mustAdd(t, b, "j", AddOptions{Data: []byte("v0")})
		j := mustAccept(t, b)
		callerErr := errors.New("caller failed")
		extra := []byte("caller-key")
		err := b.db.Transact(b.ctx, func(tx kv.Tx) error {
			if err := j.UpdateTx(tx, []byte("v1")); err != nil {
				return err
			}
			tx.Set(extra, []byte("x"))
			return callerErr
		})
		if !errors.Is(err, callerErr) {
			t.Fatal(err)
		}
		if info := mustState(t, b, "j", StateRunning); string(info.Data) != "v0" {
			t.Fatalf("data %q after rollback", info.Data)
		}
		// A committed UpdateTx carries the caller's write with it.
		if err := b.db.Transact(b.ctx, func(tx kv.Tx) error {
			if err := j.UpdateTx(tx, []byte("v2")); err != nil {
				return err
			}
			tx.Set(extra, []byte("y"))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var got []byte
		if err := b.db.ReadTransact(b.ctx, func(tx kv.ReadTx) error {
			var err error
			got, err = tx.Get(extra)
			return err
		}); err != nil || string(got) != "y" {
			t.Fatalf("caller key %q %v", got, err)
		}
	})
}

func TestMonitorRequeuesOnlyStale(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		const total, stale = 50, 5
		for i := range total {
			mustAdd(t, b, string(rune('A'+i)), AddOptions{})
		}
		var held []*Job
		for range total {
			held = append(held, mustAccept(t, b))
		}
		m := b.q.NewMonitor(MonitorOptions{BatchSize: 2})
		t0 := time.Now()
		if n, err := m.Check(b.ctx, t0); err != nil || n != 0 {
			t.Fatalf("first check: %d %v", n, err)
		}
		for _, j := range held[stale:] {
			if err := j.Update(b.ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
		// Not a whole timeout later: nothing is stale yet.
		if n, err := m.Check(b.ctx, t0.Add(30*time.Second)); err != nil || n != 0 {
			t.Fatalf("early check: %d %v", n, err)
		}
		n, err := m.Check(b.ctx, t0.Add(time.Minute))
		if err != nil || n != stale {
			t.Fatalf("check: requeued %d (%v), want %d", n, err, stale)
		}
		for i, j := range held {
			err := j.Update(b.ctx, nil)
			if i < stale {
				if !errors.Is(err, ErrWorkerConflict) {
					t.Fatalf("stale worker %s: %v", j.ID(), err)
				}
				if info := mustState(t, b, j.ID(), StatePending); info.TimeoutCount != 1 {
					t.Fatalf("timeout count %d", info.TimeoutCount)
				}
			} else if err != nil {
				t.Fatalf("live worker %s: %v", j.ID(), err)
			}
		}
		// A second monitor (another node) finds nothing to do twice.
		m2 := b.q.NewMonitor(MonitorOptions{})
		if n, err := m2.Check(b.ctx, t0); err != nil || n != 0 {
			t.Fatalf("m2: %d %v", n, err)
		}
		if n, err := m.Check(b.ctx, t0.Add(90*time.Second)); err != nil || n != 0 {
			t.Fatalf("later check: %d %v", n, err)
		}
	})
}

func TestMonitorFinishesCanceledStaleJob(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		mustAdd(t, b, "j", AddOptions{})
		mustAccept(t, b)
		if err := b.q.Cancel(b.ctx, typA, "j"); err != nil {
			t.Fatal(err)
		}
		m := b.q.NewMonitor(MonitorOptions{})
		t0 := time.Now()
		if _, err := m.Check(b.ctx, t0); err != nil {
			t.Fatal(err)
		}
		if n, err := m.Check(b.ctx, t0.Add(time.Minute)); err != nil || n != 1 {
			t.Fatalf("check: %d %v", n, err)
		}
		if info := mustState(t, b, "j", StateFinished); !info.Canceled {
			t.Fatalf("%+v", info)
		}
	})
}

func TestCorruptRecord(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{AcceptSpread: 1})
		mustAdd(t, b, "bad", AddOptions{Priority: 0})
		mustAdd(t, b, "good", AddOptions{Priority: 1})
		garbage := []byte{0xff, 0xff, 0xff, 0x01}
		if err := b.db.Transact(b.ctx, func(tx kv.Tx) error {
			tx.Set(b.q.keys.dataKey(typA, "bad"), garbage)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.q.Get(b.ctx, typA, "bad"); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("get corrupt: %v", err)
		}
		// Accept skips it (it sorts first) and takes the good job.
		if j := mustAccept(t, b); j.ID() != "good" {
			t.Fatalf("accepted %s", j.ID())
		}
		if _, err := b.q.Accept(b.ctx, typA, AcceptOptions{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("accept again: %v", err)
		}
		// Not lost: still there, still reported.
		var ids []string
		err := b.q.Fold(b.ctx, typA, func(info *JobInfo) error { ids = append(ids, info.ID); return nil })
		if !errors.Is(err, ErrCorrupt) || len(ids) != 1 || ids[0] != "good" {
			t.Fatalf("fold: %v %v", ids, err)
		}
		var raw []byte
		if err := b.db.ReadTransact(b.ctx, func(tx kv.ReadTx) error {
			var err error
			raw, err = tx.Get(b.q.keys.dataKey(typA, "bad"))
			return err
		}); err != nil || !bytes.Equal(raw, garbage) {
			t.Fatalf("corrupt record changed: %x %v", raw, err)
		}
		if err := b.q.Add(b.ctx, typA, "bad", AddOptions{}); !errors.Is(err, ErrExists) || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("add over corrupt: %v", err)
		}
		if err := b.q.Add(b.ctx, typA, "bad", AddOptions{Replace: true}); err != nil {
			t.Fatalf("replace corrupt: %v", err)
		}
		if j := mustAccept(t, b); j.ID() != "bad" {
			t.Fatalf("accepted %s", j.ID())
		}
	})
}

func TestWaitState(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		mustAdd(t, b, "j", AddOptions{})
		done := make(chan error, 1)
		go func() {
			info, err := b.q.WaitState(b.ctx, typA, "j", StateFinished)
			if err == nil && string(info.Data) != "result" {
				err = errors.New("wrong data " + string(info.Data))
			}
			done <- err
		}()
		j := mustAccept(t, b)
		if err := j.Update(b.ctx, []byte("progress")); err != nil {
			t.Fatal(err)
		}
		if err := j.Finish(b.ctx, []byte("result")); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// Removal wakes a waiter with ErrNotFound.
		go func() {
			_, err := b.q.WaitState(b.ctx, typA, "j", StateRunning)
			done <- err
		}()
		if err := b.q.Remove(b.ctx, typA, "j"); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, ErrNotFound) {
			t.Fatalf("wait on removed job: %v", err)
		}
	})
}

func TestAcceptWaits(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		got := make(chan *Job, 1)
		errc := make(chan error, 1)
		go func() {
			j, err := b.q.Accept(b.ctx, typA, AcceptOptions{Wait: true})
			if err != nil {
				errc <- err
				return
			}
			got <- j
		}()
		mustAdd(t, b, "late", AddOptions{})
		select {
		case j := <-got:
			if j.ID() != "late" {
				t.Fatalf("accepted %s", j.ID())
			}
		case err := <-errc:
			t.Fatal(err)
		}
		// A canceled context ends the wait.
		ctx, cancel := context.WithCancel(b.ctx)
		go func() {
			_, err := b.q.Accept(ctx, typA, AcceptOptions{Wait: true})
			errc <- err
		}()
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled wait: %v", err)
		}
	})
}

func TestCorruptRunningRecord(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		mustAdd(t, b, "j", AddOptions{})
		j := mustAccept(t, b)
		m := b.q.NewMonitor(MonitorOptions{})
		t0 := time.Now()
		if _, err := m.Check(b.ctx, t0); err != nil {
			t.Fatal(err)
		}
		key := b.q.keys.dataKey(typA, "j")
		garbage := []byte("\x0a\x05short") // activity_stamp field cut short
		if err := b.db.Transact(b.ctx, func(tx kv.Tx) error { tx.Set(key, garbage); return nil }); err != nil {
			t.Fatal(err)
		}
		if err := j.Update(b.ctx, nil); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("update of corrupt job: %v", err)
		}
		// The monitor meets the corrupt record: no panic, no error, no loss.
		if n, err := m.Check(b.ctx, t0.Add(time.Minute)); err != nil || n != 0 {
			t.Fatalf("monitor: %d %v", n, err)
		}
		var raw []byte
		if err := b.db.ReadTransact(b.ctx, func(tx kv.ReadTx) error {
			var err error
			raw, err = tx.Get(key)
			return err
		}); err != nil || !bytes.Equal(raw, garbage) {
			t.Fatalf("record after monitor: %x %v", raw, err)
		}
		if err := b.q.Remove(b.ctx, typA, "j"); err != nil {
			t.Fatalf("remove corrupt: %v", err)
		}
		if _, err := b.q.Get(b.ctx, typA, "j"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get after remove: %v", err)
		}
	})
}

// TestAddFinished: a job added finished is stored for users to read but is
// never accepted, and Replace later makes it a normal pending job.
func TestAddFinished(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		mustAdd(t, b, "invalid", AddOptions{Finished: true, Data: []byte("why")})
		info := mustState(t, b, "invalid", StateFinished)
		if string(info.Data) != "why" || info.FinishedAt.IsZero() {
			t.Fatalf("finished job: data %q, finished at %v", info.Data, info.FinishedAt)
		}
		if _, err := b.q.Accept(b.ctx, typA, AcceptOptions{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Accept took a job added finished: %v", err)
		}
		if n, err := b.q.PendingCount(b.ctx, typA, 0); err != nil || n != 0 {
			t.Fatalf("pending count %d, %v; want 0", n, err)
		}
		mustAdd(t, b, "invalid", AddOptions{Replace: true})
		mustState(t, b, "invalid", StatePending)
		if j := mustAccept(t, b); j.ID() != "invalid" {
			t.Fatalf("accepted %q", j.ID())
		}
	})
}

// TestAcceptHeadCache: the READY keys an Accept read and left are taken by
// the next Accepts of the same Queue without a read of the head, but only
// while their jobs are still pending and due: jobs another node took
// meanwhile, resubmitted to a later time or running, are neither taken
// nor lost.
func TestAcceptHeadCache(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{AcceptSpread: 16})
		other := New(b.db, Options{Clock: b.clock.Now, NodeName: "node2", AcceptSpread: 16})
		const n = 10
		for i := range n {
			mustAdd(t, b, fmt.Sprintf("j%d", i), AddOptions{Priority: uint64(i % 3)})
		}
		first := mustAccept(t, b)
		cached := func() int {
			b.q.claimMu.Lock()
			defer b.q.claimMu.Unlock()
			if h := b.q.heads[typA]; h != nil {
				return len(h.keys)
			}
			return 0
		}
		if got := cached(); got != n-1 {
			t.Fatalf("%d head keys cached after the first Accept, want %d", got, n-1)
		}
		// The second Accept takes a cached key.
		second := mustAccept(t, b)
		if got := cached(); got != n-2 || second.ID() == first.ID() {
			t.Fatalf("second Accept: %s (first %s), %d cached, want %d", second.ID(), first.ID(), got, n-2)
		}
		// Another node takes every other pending job and resubmits it to
		// an hour later: pending, same priority, DELAYED. Not due: the
		// cached keys must not be taken.
		later := b.clock.Now().Add(time.Hour)
		var delayed []string
		for i := range n - 2 {
			j, err := other.Accept(b.ctx, typA, AcceptOptions{})
			if err != nil {
				t.Fatalf("other node's accept %d: %v", i, err)
			}
			if err := j.Resubmit(b.ctx, nil, ResubmitOptions{ScheduledAt: later}); err != nil {
				t.Fatal(err)
			}
			delayed = append(delayed, j.ID())
		}
		if got := cached(); got != n-2 {
			t.Fatalf("%d head keys cached, want %d", got, n-2)
		}
		if j, err := b.q.Accept(b.ctx, typA, AcceptOptions{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("accept with a cached head of delayed jobs: %v %v, want ErrNotFound", j, err)
		}
		for _, id := range delayed {
			mustState(t, b, id, StatePending)
		}
		// Due: one Accept reads the head, takes one and caches the rest;
		// the other node then takes and runs those: they are not taken
		// again.
		b.clock.Advance(2 * time.Hour)
		third := mustAccept(t, b)
		if !slices.Contains(delayed, third.ID()) || cached() != len(delayed)-1 {
			t.Fatalf("accepted %s with %d cached; the due ones are %v", third.ID(), cached(), delayed)
		}
		for i := range len(delayed) - 1 {
			if _, err := other.Accept(b.ctx, typA, AcceptOptions{}); err != nil {
				t.Fatalf("other node's accept %d: %v", i, err)
			}
		}
		if j, err := b.q.Accept(b.ctx, typA, AcceptOptions{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("accept with a cached head of running jobs: %v %v, want ErrNotFound", j, err)
		}
		for _, id := range delayed {
			if id != third.ID() {
				if info := mustState(t, b, id, StateRunning); info.WorkerNode != "node2" {
					t.Fatalf("%s runs on %s", id, info.WorkerNode)
				}
			}
		}
	})
}

// TestGeneration: every write of a job's record (add, accept, update,
// finish, resubmit, remove, a requeue by the activity monitor) changes the
// type's generation; reads and other types' writes do not.
func TestGeneration(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{})
		if err := b.q.SetTypeTimeout(b.ctx, "other", time.Minute); err != nil {
			t.Fatal(err)
		}
		gen := func() int64 {
			t.Helper()
			g, err := b.q.Generation(b.ctx, typA)
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		last := gen()
		step := func(what string, changes bool, f func() error) {
			t.Helper()
			if err := f(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			g := gen()
			if changed := g != last; changed != changes {
				t.Fatalf("%s: generation %d -> %d, want a change: %t", what, last, g, changes)
			}
			last = g
		}
		step("add", true, func() error { return b.q.Add(b.ctx, typA, "j1", AddOptions{Data: []byte("v0")}) })
		step("read", false, func() error { _, err := b.q.Get(b.ctx, typA, "j1"); return err })
		step("other type", false, func() error { return b.q.Add(b.ctx, "other", "x", AddOptions{}) })
		var j *Job
		step("accept", true, func() (err error) { j, err = b.q.Accept(b.ctx, typA, AcceptOptions{}); return err })
		step("update", true, func() error { return j.Update(b.ctx, []byte("v1")) })
		step("finish", true, func() error { return j.Finish(b.ctx, nil) })
		step("resubmit", true, func() error { return b.q.Resubmit(b.ctx, typA, "j1", ResubmitOptions{}) })
		step("accept again", true, func() (err error) { j, err = b.q.Accept(b.ctx, typA, AcceptOptions{}); return err })
		step("requeue by the monitor", true, func() error {
			m := b.q.NewMonitor(MonitorOptions{})
			if _, err := m.Check(b.ctx, time.Now()); err != nil {
				return err
			}
			n, err := m.Check(b.ctx, time.Now().Add(2*time.Minute))
			if err == nil && n != 1 {
				err = fmt.Errorf("requeued %d jobs, want 1", n)
			}
			return err
		})
		step("remove", true, func() error { return b.q.Remove(b.ctx, typA, "j1") })
	})
}

// TestRunningByNode: the count per worker node read from the records'
// state and node fields equals what a Fold of the decoded records counts,
// through accepts by two nodes, a finish and a requeue.
func TestRunningByNode(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		b := setup(t, Options{NodeName: "n1"})
		q2 := New(b.db, Options{NodeName: "n2", Clock: b.clock.Now})
		for i := range 6 {
			mustAdd(t, b, fmt.Sprintf("j%d", i), AddOptions{Data: bytes.Repeat([]byte("d"), 3000)})
		}
		check := func(what string, want map[string]int) {
			t.Helper()
			got, err := b.q.RunningByNode(b.ctx, typA)
			if err != nil {
				t.Fatal(err)
			}
			folded := map[string]int{}
			if err := b.q.Fold(b.ctx, typA, func(info *JobInfo) error {
				if info.State == StateRunning {
					folded[info.WorkerNode]++
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, want) || !maps.Equal(folded, want) {
				t.Fatalf("%s: running by node %v (a fold counts %v), want %v", what, got, folded, want)
			}
		}
		check("all pending", map[string]int{})
		var jobs []*Job
		for _, q := range []*Queue{b.q, b.q, q2} {
			j, err := q.Accept(b.ctx, typA, AcceptOptions{})
			if err != nil {
				t.Fatal(err)
			}
			jobs = append(jobs, j)
		}
		check("three accepted", map[string]int{"n1": 2, "n2": 1})
		if err := jobs[0].Finish(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		check("one finished", map[string]int{"n1": 1, "n2": 1})
		if err := jobs[2].Resubmit(b.ctx, nil, ResubmitOptions{}); err != nil {
			t.Fatal(err)
		}
		check("one resubmitted", map[string]int{"n1": 1})
	})
}

// conflictOnce is a store whose next transaction, once armed, has its
// first attempt aborted by a conflict: after that attempt's function ran,
// another transaction rewrites key (which the attempt read) before it
// commits.
type conflictOnce struct {
	kv.Database
	armed atomic.Bool
	key   []byte
}

func (c *conflictOnce) Transact(ctx context.Context, fn func(kv.Tx) error) error {
	return c.Database.Transact(ctx, func(tx kv.Tx) error {
		err := fn(tx)
		if err == nil && c.armed.CompareAndSwap(true, false) {
			if werr := c.Database.Transact(ctx, func(tx kv.Tx) error {
				v, err := tx.Get(c.key)
				if err == nil {
					tx.Set(c.key, v)
				}
				return err
			}); werr != nil {
				return werr
			}
		}
		return err
	})
}

// TestAcceptRetryPromotesAgain: an Accept whose attempt promoted the due
// DELAYED jobs and then lost a conflict promotes them again in its next
// attempt, and takes the best of them; it used to take the worse job
// already READY, the promotion counted as done for another promoteEvery
// (a crash storm on PostgreSQL lost a fifth of its promotions so, and
// with them the fair share of the busiest database).
func TestAcceptRetryPromotesAgain(t *testing.T) {
	for _, many := range []bool{false, true} {
		t.Run(map[bool]string{false: "Accept", true: "AcceptMany"}[many], func(t *testing.T) {
			storetest.Each(t, func(t *testing.T) {
				db := &conflictOnce{Database: openTestDB(t)}
				clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
				q := New(db, Options{Clock: clock.Now, NodeName: "node1", AcceptSpread: 1})
				b := &bundle{db: db, q: q, clock: clock, ctx: t.Context()}
				if err := q.SetTypeTimeout(b.ctx, typA, time.Minute); err != nil {
					t.Fatal(err)
				}
				mustAdd(t, b, "first", AddOptions{Priority: 50})
				mustAdd(t, b, "far", AddOptions{Priority: 100})
				// Crashed, in a 1 ms backoff, the best priority.
				mustAdd(t, b, "near", AddOptions{Priority: 1, ScheduledAt: clock.Now().Add(time.Millisecond)})
				if j := mustAccept(t, b); j.ID() != "first" { // promotes (nothing due yet)
					t.Fatalf("accepted %s, want first", j.ID())
				}
				clock.Advance(promoteEvery) // near is due, a promotion too
				// The attempt promoting near reads its record with a
				// conflict: another transaction rewrites it meanwhile.
				db.key = q.keys.dataKey(typA, "near")
				db.armed.Store(true)
				var got string
				if many {
					// Two jobs: a batch of one is Accept.
					jobs, err := q.AcceptMany(b.ctx, typA, 2, AcceptOptions{})
					if err != nil {
						t.Fatal(err)
					}
					got = jobs[0].ID()
				} else {
					got = mustAccept(t, b).ID()
				}
				if db.armed.Load() {
					t.Fatal("no attempt ran into the injected conflict")
				}
				if got != "near" {
					t.Fatalf("accepted %s after a conflict, want near (due, promoted by the attempt that did not commit)", got)
				}
			})
		})
	}
}
