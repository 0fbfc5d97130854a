package repjob_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/kv/storetest"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
)

func failure(i int, at time.Time) *messages.DocWriteFailure {
	return &messages.DocWriteFailure{Id: fmt.Sprintf("doc%03d", i), Rev: "1-a", Status: 403, Error: "forbidden",
		Reason: "no", At: timestamppb.New(at)}
}

// TestMergeWriteFailures: a record keeps the last 100 refused documents,
// each once, oldest first, within its byte bound, whatever a run reports
// again.
func TestMergeWriteFailures(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var old, run []*messages.DocWriteFailure
	for i := range 60 {
		old = append(old, failure(i, t0.Add(time.Duration(i)*time.Second)))
	}
	for i := 60; i < 130; i++ {
		run = append(run, failure(i, t0.Add(time.Duration(i)*time.Second)))
	}
	tests := []struct {
		name       string
		old, new   []*messages.DocWriteFailure
		n          int
		first, end string
	}{
		{"none new", old, nil, 60, "doc000", "doc059"},
		{"the same again", old, old, 60, "doc000", "doc059"},
		{"bounded to the newest 100", old, run, 100, "doc030", "doc129"},
		{"a run's report merged twice", repjob.MergeWriteFailures(old, run), run, 100, "doc030", "doc129"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := repjob.MergeWriteFailures(tc.old, tc.new)
			if len(got) != tc.n || got[0].GetId() != tc.first || got[len(got)-1].GetId() != tc.end {
				t.Fatalf("%d failures %s..%s, want %d %s..%s", len(got), got[0].GetId(), got[len(got)-1].GetId(), tc.n, tc.first, tc.end)
			}
		})
	}
	// Long reasons: the list stays within 32 KiB (a record is one store value).
	var big []*messages.DocWriteFailure
	for i := range 100 {
		f := failure(i, t0.Add(time.Duration(i)*time.Second))
		f.Reason = strings.Repeat("x", 500)
		big = append(big, f)
	}
	got := repjob.MergeWriteFailures(nil, big)
	size := 0
	for _, f := range got {
		size += proto.Size(f)
	}
	if size > 32<<10 || len(got) == 0 || got[len(got)-1].GetId() != "doc099" {
		t.Fatalf("%d failures, %d bytes; want the newest within 32 KiB", len(got), size)
	}
}

// TestRunKeepsWriteFailuresAndLag: a run's refused documents go into the
// record and stay there across runs; behind_since follows the checkpointed
// sequence while changes are pending, and Lag is the time since.
func TestRunKeepsWriteFailuresAndLag(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	res, err := e.store.AddTransient(ctx, body("http://a/s", "http://b/t", `,"continuous":true`), "alice")
	if err != nil {
		t.Fatal(err)
	}
	pending := func(n int64) *int64 { return &n }
	run, err := e.store.Accept(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Start(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	t0 := e.clock.Now()
	st := replicate.Stats{ChangesPending: pending(5), CheckpointedSourceSeq: couch.Seq(`"1"`),
		WriteFailures: []replicate.WriteFailure{{ID: "a", Rev: "1-x", Status: 403, Error: "forbidden", Reason: "no", At: t0}}}
	if err := run.Progress(ctx, st); err != nil {
		t.Fatal(err)
	}
	get := func() *repjob.Record {
		t.Helper()
		r, err := e.store.Get(ctx, res.JobID)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := get(); len(r.GetStats().GetWriteFailures()) != 1 || !r.GetStats().GetBehindSince().AsTime().Equal(t0) {
		t.Fatalf("after the first report: %v", r.GetStats())
	}
	e.clock.Advance(10 * time.Minute)
	if err := run.Progress(ctx, st); err != nil { // no progress: behind_since kept
		t.Fatal(err)
	}
	if lag := repjob.Lag(get(), e.clock.Now()); lag != 10*time.Minute {
		t.Fatalf("lag %v, want 10m", lag)
	}
	if err := run.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// The next run reports its own failures only: the record keeps both.
	run, err = e.store.Accept(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Start(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	t1 := e.clock.Now()
	st = replicate.Stats{ChangesPending: pending(3), CheckpointedSourceSeq: couch.Seq(`"2"`),
		WriteFailures: []replicate.WriteFailure{{ID: "b", Rev: "1-y", Status: 413, Error: "too_large", Reason: "big", At: t1}}}
	if err := run.Progress(ctx, st); err != nil {
		t.Fatal(err)
	}
	r := get()
	if fs := r.GetStats().GetWriteFailures(); len(fs) != 2 || fs[0].GetId() != "a" || fs[1].GetId() != "b" {
		t.Fatalf("failures across runs: %v", fs)
	}
	if lag := repjob.Lag(r, e.clock.Now()); lag != 0 { // the checkpoint advanced
		t.Fatalf("lag after progress %v, want 0", lag)
	}
	st.ChangesPending = pending(0)
	if err := run.Progress(ctx, st); err != nil {
		t.Fatal(err)
	}
	if r := get(); r.GetStats().GetBehindSince() != nil {
		t.Fatalf("caught up, behind_since %v", r.GetStats().GetBehindSince())
	}
}

// TestPauseResumeReset: a pending job is paused in the store (pending,
// never due, "stopped" in its history) and resumed; a running one gets a
// pause request for its node, whose run records the pause as it ends; a
// reset marks the next run to start from 0 and a checkpoint of that run
// clears it.
func TestPauseResumeReset(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e := newEnv(t, nil)
		res, err := e.store.AddTransient(ctx, body("http://a/s", "http://b/t", `,"continuous":true`), "alice")
		if err != nil {
			t.Fatal(err)
		}
		id := res.JobID
		get := func() *repjob.Record {
			t.Helper()
			r, err := e.store.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		if c, err := e.store.Pause(ctx, id, "n2"); err != nil || c != nil {
			t.Fatalf("pause of a pending job: %v %v", c, err)
		}
		r := get()
		if !r.Paused() || r.State() != repjob.StatePending || r.History()[0].Type != schedpolicy.EventStopped || !r.ScheduledAt.Equal(repjob.PausedUntil) {
			t.Fatalf("paused job: paused %v state %v history %v scheduled %v", r.Paused(), r.State(), r.History(), r.ScheduledAt)
		}
		if _, err := e.store.Accept(ctx, false); err == nil {
			t.Fatal("a paused job was accepted")
		}
		if n, err := e.store.PendingCount(ctx, 0); err != nil || n != 0 {
			t.Fatalf("pending count with a paused job: %d %v", n, err)
		}
		if err := e.store.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		if r := get(); r.Paused() {
			t.Fatal("still paused after resume")
		}
		run, err := e.store.Accept(ctx, false)
		if err != nil {
			t.Fatalf("accept after resume: %v", err)
		}
		if err := run.Start(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		c, err := e.store.Pause(ctx, id, "n2")
		if err != nil || c.GetAction() != messages.JobControl_ACTION_PAUSE || c.GetNode() != "n1" {
			t.Fatalf("pause of a running job: %v %v", c, err)
		}
		if r := get(); r.Paused() {
			t.Fatal("a running job's record was paused by another node")
		}
		if err := run.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if r := get(); !r.Paused() || r.State() != repjob.StatePending {
			t.Fatalf("after the run's pause: paused %v state %v", r.Paused(), r.State())
		}
		// A reset of a paused job: reset for when it resumes, still paused.
		if c, err := e.store.Reset(ctx, id, "n2"); err != nil || c != nil {
			t.Fatalf("reset: %v %v", c, err)
		}
		if r := get(); !r.Paused() || r.GetResetAt() == nil {
			t.Fatalf("reset of a paused job: paused %v reset %v", r.Paused(), r.GetResetAt())
		}
		if err := e.store.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		run, err = e.store.Accept(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Start(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		if run.Record().GetResetAt() == nil {
			t.Fatal("the run after a reset does not see reset_at")
		}
		st := replicate.Stats{StartFrom: replicate.StartReset, StartSeq: couch.Seq("0"), CheckpointedSourceSeq: couch.Seq("0")}
		if err := run.Progress(ctx, st); err != nil {
			t.Fatal(err)
		}
		if get().GetResetAt() == nil {
			t.Fatal("reset_at cleared before the run's first checkpoint")
		}
		st.CheckpointedSourceSeq = couch.Seq("7")
		if err := run.Progress(ctx, st); err != nil {
			t.Fatal(err)
		}
		if get().GetResetAt() != nil {
			t.Fatal("reset_at kept after the reset run's checkpoint")
		}
		if err := run.Complete(ctx, replicate.Result{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.Pause(ctx, id, "n2"); !errors.Is(err, repjob.ErrFinished) {
			t.Fatalf("pause of a completed job: %v, want ErrFinished", err)
		}
	})
}
