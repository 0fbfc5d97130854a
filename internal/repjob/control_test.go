package repjob_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv/storetest"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/messages"
)

// TestControl: a request is addressed to the node running the job and its
// run, joins a pending one, wakes that node's watch, ends when cleared or
// when its run ends; Cancel asks the running job's node to stop it in the
// same transaction.
func TestControl(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e := newEnv(t, nil)
		add := func(src string) string {
			t.Helper()
			r, err := e.store.AddTransient(ctx, body(src, "http://b/t", `,"continuous":true`), "alice")
			if err != nil {
				t.Fatal(err)
			}
			return r.JobID
		}
		id := add("http://a/one")
		if _, err := e.store.RequestControl(ctx, id, messages.JobControl_ACTION_STOP, "n2"); !errors.Is(err, repjob.ErrNotRunning) {
			t.Fatalf("control of a pending job: %v, want ErrNotRunning", err)
		}
		if _, err := e.store.RequestControl(ctx, "nope", messages.JobControl_ACTION_STOP, "n2"); !errors.Is(err, repjob.ErrNotFound) {
			t.Fatalf("control of an unknown job: %v, want ErrNotFound", err)
		}
		_, w, err := e.store.Controls(ctx, "n1")
		if err != nil {
			t.Fatal(err)
		}
		defer w.Cancel()
		run, err := e.store.Accept(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Start(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		c, err := e.store.RequestControl(ctx, id, messages.JobControl_ACTION_STOP, "n2")
		if err != nil {
			t.Fatal(err)
		}
		if c.GetNode() != "n1" || c.GetRun() != run.Generation() || c.GetRequestedBy() != "n2" || c.GetId() == "" {
			t.Fatalf("request %v", c)
		}
		if err := w.Wait(ctx); err != nil {
			t.Fatalf("n1's watch: %v", err)
		}
		again, err := e.store.RequestControl(ctx, id, messages.JobControl_ACTION_RESTART, "n3")
		if err != nil || again.GetId() != c.GetId() {
			t.Fatalf("second request %v (%v), want the pending one %v", again, err, c)
		}
		for node, want := range map[string]int{"n1": 1, "n2": 0} {
			got, w, err := e.store.Controls(ctx, node)
			if err != nil {
				t.Fatal(err)
			}
			w.Cancel()
			if len(got) != want {
				t.Fatalf("controls of %s: %v, want %d", node, got, want)
			}
		}
		waited := make(chan error, 1)
		go func() { waited <- e.store.WaitControl(ctx, c) }()
		if err := e.store.ClearControl(ctx, c); err != nil {
			t.Fatal(err)
		}
		if err := <-waited; err != nil {
			t.Fatalf("wait after clear: %v", err)
		}

		// A request whose run ends without its node clearing it is stale.
		c, err = e.store.RequestControl(ctx, id, messages.JobControl_ACTION_STOP, "n2")
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if stale, err := e.store.Stale(ctx, c); err != nil || !stale {
			t.Fatalf("stale %v %v after the run stopped", stale, err)
		}
		if err := e.store.WaitControl(ctx, c); err != nil {
			t.Fatalf("wait for a stale request: %v", err)
		}
		if n, err := e.store.CleanupControls(ctx); err != nil || n != 0 {
			t.Fatalf("cleanup after the waiter cleared: %d %v", n, err)
		}

		// Cancel: a pending job needs no request; a running one gets a cancel
		// request (replacing a pending stop) and is removed at once.
		other := add("http://a/two")
		if c, err := e.store.Cancel(ctx, other, "n2"); err != nil || c != nil {
			t.Fatalf("cancel of a pending job: %v %v", c, err)
		}
		run, err = e.store.Accept(ctx, false)
		if err != nil || run.ID() != id {
			t.Fatalf("accept: %v %v", run, err)
		}
		if err := run.Start(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.RequestControl(ctx, id, messages.JobControl_ACTION_STOP, "n2"); err != nil {
			t.Fatal(err)
		}
		c, err = e.store.Cancel(ctx, id, "n2")
		if err != nil || c.GetAction() != messages.JobControl_ACTION_CANCEL || c.GetNode() != "n1" {
			t.Fatalf("cancel of a running job: %v %v", c, err)
		}
		if _, err := e.store.Get(ctx, id); !errors.Is(err, repjob.ErrNotFound) {
			t.Fatalf("canceled transient job: %v", err)
		}
		if n, err := e.store.CleanupControls(ctx); err != nil || n != 0 {
			t.Fatalf("cleanup of a fresh cancel request: %d %v, want 0 (its node stops the job)", n, err)
		}
		e.clock.Advance(e.store.ActivityTimeout() + time.Second)
		if n, err := e.store.CleanupControls(ctx); err != nil || n != 1 {
			t.Fatalf("cleanup of the cancel request after the activity timeout: %d %v, want 1", n, err)
		}
	})
}

// TestCancelDocumentJobRefused: the job of a _replicator document follows
// its document; Cancel refuses it (ErrDocumentJob) whatever its state and
// changes nothing: a running one stays running, its worker's writes and its
// clean stop still succeed, and no control request is left for its node.
// (Cancel used to flag it canceled in the queue while its record said
// running: a job no worker ran that every view showed running.)
func TestCancelDocumentJobRefused(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e := newEnv(t, nil)
		doc := repjob.PersistentDoc{Server: "http://c/", DB: "_replicator", DocID: "d1",
			Body: body("http://a/s", "http://b/t", `,"continuous":true`)}
		res, err := e.store.AddPersistent(ctx, doc)
		if err != nil {
			t.Fatal(err)
		}
		var run *repjob.Run
		states := []struct {
			name string
			want repjob.State
			step func() error
		}{
			{"pending", repjob.StatePending, func() error { return nil }},
			{"running", repjob.StateRunning, func() error {
				var err error
				if run, err = e.store.Accept(ctx, false); err != nil {
					return err
				}
				return run.Start(ctx, "n1")
			}},
		}
		for _, st := range states {
			if err := st.step(); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			before, err := e.store.Get(ctx, res.JobID)
			if err != nil {
				t.Fatal(err)
			}
			c, err := e.store.Cancel(ctx, res.JobID, "n2")
			if !errors.Is(err, repjob.ErrDocumentJob) || c != nil {
				t.Fatalf("%s: cancel of a document's job: %v %v, want ErrDocumentJob", st.name, c, err)
			}
			after, err := e.store.Get(ctx, res.JobID)
			if err != nil || after.State() != st.want || after.Version != before.Version || after.Canceled {
				t.Fatalf("%s: job after the refused cancel: %v %v", st.name, after, err)
			}
			controls, w, err := e.store.Controls(ctx, "n1")
			if err != nil {
				t.Fatal(err)
			}
			w.Cancel()
			if len(controls) != 0 {
				t.Fatalf("%s: control requests after the refused cancel: %v", st.name, controls)
			}
		}
		if err := run.Progress(ctx, replicate.Stats{}); err != nil {
			t.Fatalf("progress after the refused cancel: %v", err)
		}
		if err := run.Stop(ctx); err != nil {
			t.Fatalf("stop after the refused cancel: %v", err)
		}
		if got, err := e.store.Get(ctx, res.JobID); err != nil || got.State() != repjob.StatePending {
			t.Fatalf("job after its clean stop: %v %v", got, err)
		}
	})
}

// TestRemoveOrReplaceStopsRun: removing a running job (its document or
// database deleted, its server no longer watched) or replacing it (its
// document changed, valid or not) asks the node running it to stop that
// run now, in the same transaction: a cancel request for that node and run.
// Before, the job's actor ran on until its next write to the store.
func TestRemoveOrReplaceStopsRun(t *testing.T) {
	doc := repjob.PersistentDoc{Server: "http://c/", DB: "_replicator", DocID: "d1",
		Body: body("http://a/s", "http://b/t", `,"continuous":true`)}
	changed := doc
	changed.Body = body("http://a/other", "http://b/t", `,"continuous":true`)
	cases := []struct {
		name string
		do   func(ctx context.Context, s *repjob.Store, id string) error
		// gone: the job no longer exists; else it is pending or failed.
		gone bool
		want repjob.State
	}{
		{name: "removed", gone: true, do: func(ctx context.Context, s *repjob.Store, id string) error { return s.Remove(ctx, id) }},
		{name: "document changed", want: repjob.StatePending, do: func(ctx context.Context, s *repjob.Store, _ string) error {
			_, err := s.AddPersistent(ctx, changed)
			return err
		}},
		{name: "document made invalid", want: repjob.StateFailed, do: func(ctx context.Context, s *repjob.Store, _ string) error {
			_, err := s.AddInvalid(ctx, doc, "Missing `source` field")
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				e := newEnv(t, nil)
				res, err := e.store.AddPersistent(ctx, doc)
				if err != nil {
					t.Fatal(err)
				}
				run, err := e.store.Accept(ctx, false)
				if err != nil {
					t.Fatal(err)
				}
				if err := run.Start(ctx, "n1"); err != nil {
					t.Fatal(err)
				}
				if err := tc.do(ctx, e.store, res.JobID); err != nil {
					t.Fatal(err)
				}
				controls, w, err := e.store.Controls(ctx, "n1")
				if err != nil {
					t.Fatal(err)
				}
				w.Cancel()
				if len(controls) != 1 || controls[0].GetJobId() != res.JobID ||
					controls[0].GetAction() != messages.JobControl_ACTION_CANCEL || controls[0].GetRun() != run.Generation() {
					t.Fatalf("control requests for n1: %v, want one cancel of job %s run %d", controls, res.JobID, run.Generation())
				}
				got, err := e.store.Get(ctx, res.JobID)
				switch {
				case tc.gone && !errors.Is(err, repjob.ErrNotFound):
					t.Fatalf("job after %s: %v %v, want not found", tc.name, got, err)
				case !tc.gone && (err != nil || got.State() != tc.want):
					t.Fatalf("job after %s: %v %v, want %s", tc.name, got, err, tc.want)
				}
				if err := run.Progress(ctx, replicate.Stats{}); !repjob.IsLost(err) {
					t.Fatalf("the old run's next write: %v, want lost", err)
				}
			})
		})
	}
}
