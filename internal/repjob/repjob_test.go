package repjob_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/storetest"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
)

const uuid = "0123456789abcdef0123456789abcdef"

func TestMain(m *testing.M) {
	code := m.Run()
	storetest.Stop()
	os.Exit(code)
}

type env struct {
	store *repjob.Store
	q     *jobqueue.Queue
	clock *schedpolicy.FakeClock
	db    kv.Database
}

func newEnv(t testing.TB, mod func(*repjob.Options)) *env {
	t.Helper()
	db := storetest.Open(t)
	clock := schedpolicy.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	q := jobqueue.New(db, jobqueue.Options{Clock: clock.Now, NodeName: "n1", AcceptSpread: 1})
	opts := repjob.Options{Clock: clock, ServerUUID: uuid, Policy: schedpolicy.DefaultPolicy()}
	if mod != nil {
		mod(&opts)
	}
	return &env{store: repjob.New(q, db, opts), q: q, clock: clock, db: db}
}

func body(src, tgt string, extra string) []byte {
	return []byte(`{"source":"` + src + `","target":"` + tgt + `"` + extra + `}`)
}

func TestAddTransient(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		b := body("http://a:5984/src", "http://b:5984/tgt", "")
		r1, err := e.store.AddTransient(ctx, b, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if r1.Existed || r1.RepID == "" || r1.Record.State() != repjob.StatePending {
			t.Fatalf("first add: %+v state %v", r1, r1.Record.State())
		}
		base, ext, _ := replicate.ID(mustParse(t, b), uuid)
		if r1.RepID != base+ext {
			t.Fatalf("rep id %q, want %q", r1.RepID, base+ext)
		}
		cases := []struct {
			name    string
			body    []byte
			user    string
			existed bool
			sameJob bool
		}{
			{"same body same user is a no-op", b, "alice", true, true},
			{"whitespace does not matter", []byte(` {"source": "http://a:5984/src", "target":"http://b:5984/tgt"}`), "alice", true, true},
			{"continuous maps to the same job id", body("http://a:5984/src", "http://b:5984/tgt", `,"continuous":true`), "alice", true, true},
			{"credentials do not change the job id", body("http://u:p@a:5984/src", "http://b:5984/tgt", ""), "alice", true, true},
			{"other user is another job", b, "bob", false, false},
			{"other target is another job", body("http://a:5984/src", "http://b:5984/other", ""), "alice", false, false},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				r, err := e.store.AddTransient(ctx, c.body, c.user)
				if err != nil {
					t.Fatal(err)
				}
				if r.Existed != c.existed || (r.JobID == r1.JobID) != c.sameJob {
					t.Fatalf("existed=%v same=%v, want %v %v", r.Existed, r.JobID == r1.JobID, c.existed, c.sameJob)
				}
			})
		}
		if _, err := e.store.AddTransient(ctx, []byte(`{"source":"http://a/x"}`), "alice"); !errors.Is(err, repjob.ErrInvalid) ||
			!errors.Is(err, replicate.ErrInvalidParams) {
			t.Fatalf("invalid body: %v", err)
		}
		got, err := e.store.FindByRepID(ctx, r1.RepID)
		if err != nil || got.JobId != r1.JobID {
			t.Fatalf("FindByRepID: %v %v", got, err)
		}
		got, err = e.store.FindByRepID(ctx, base)
		if err != nil || got.JobId != r1.JobID {
			t.Fatalf("FindByRepID(base): %v %v", got, err)
		}
		if _, err := e.store.Get(ctx, "nope"); !errors.Is(err, repjob.ErrNotFound) {
			t.Fatalf("Get unknown: %v", err)
		}
	})
}

func mustParse(t testing.TB, b []byte) replicate.Params {
	t.Helper()
	p, err := replicate.ParseParams(b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAddPersistentReplacesRunningJob(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		doc := repjob.PersistentDoc{Server: "http://couch:5984/", DB: "_replicator", DocID: "d1",
			Body: body("http://a/src", "http://b/tgt", "")}
		r, err := e.store.AddPersistent(ctx, doc)
		if err != nil {
			t.Fatal(err)
		}
		if r.JobID != "http://couch:5984|_replicator|d1" {
			t.Fatalf("job id %q", r.JobID)
		}
		run, err := e.store.Accept(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Start(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		// The same document again is a no-op; a changed one takes the job away
		// from its worker.
		if again, err := e.store.AddPersistent(ctx, doc); err != nil || !again.Existed {
			t.Fatalf("same doc: %+v %v", again, err)
		}
		doc.Body = body("http://a/src", "http://b/tgt", `,"continuous":true`)
		if r2, err := e.store.AddPersistent(ctx, doc); err != nil || r2.Existed {
			t.Fatalf("changed doc: %+v %v", r2, err)
		}
		if err := run.Progress(ctx, replicate.Stats{DocsRead: 1}); !errors.Is(err, jobqueue.ErrWorkerConflict) || !repjob.IsLost(err) {
			t.Fatalf("progress after replace: %v", err)
		}
		rec, err := e.store.Get(ctx, r.JobID)
		if err != nil || !rec.Continuous || rec.State() != repjob.StatePending {
			t.Fatalf("after replace: %+v %v", rec, err)
		}
	})
}

func TestRunLifecycle(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, func(o *repjob.Options) { o.TransientMaxAge = time.Hour })
		r, err := e.store.AddTransient(ctx, body("http://a/src", "http://b/tgt", ""), "alice")
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
		rec, _ := e.store.Get(ctx, r.JobID)
		if rec.State() != repjob.StateRunning || rec.Node != "n1" {
			t.Fatalf("started: %v %q", rec.State(), rec.Node)
		}
		if err := run.Progress(ctx, replicate.Stats{DocsRead: 7, DocsWritten: 6}); err != nil {
			t.Fatal(err)
		}
		rec, _ = e.store.Get(ctx, r.JobID)
		if rec.Stats.GetDocsRead() != 7 || rec.Stats.GetDocsWritten() != 6 {
			t.Fatalf("stats %+v", rec.Stats)
		}
		e.clock.Advance(time.Minute)
		if err := run.Complete(ctx, replicate.Result{Body: []byte(`{"ok":true}`), Stats: replicate.Stats{DocsRead: 9}}); err != nil {
			t.Fatal(err)
		}
		rec, err = e.store.WaitFinished(ctx, r.JobID)
		if err != nil || rec.State() != repjob.StateCompleted ||
			string(rec.Result) != `{"ok":true}` || rec.Stats.GetDocsRead() != 9 {
			t.Fatalf("completed: %+v %v", rec, err)
		}
		// A re-POST of a finished transient job runs it again.
		again, err := e.store.AddTransient(ctx, body("http://a/src", "http://b/tgt", ""), "alice")
		if err != nil || again.Existed {
			t.Fatalf("re-add finished: %+v %v", again, err)
		}
		run, _ = e.store.Accept(ctx, false)
		_ = run.Start(ctx, "n1")
		if err := run.Complete(ctx, replicate.Result{}); err != nil {
			t.Fatal(err)
		}
		// Kept for TransientMaxAge, then removed.
		if n, err := e.store.CleanupTransient(ctx); err != nil || n != 0 {
			t.Fatalf("early cleanup: %d %v", n, err)
		}
		e.clock.Advance(time.Hour + time.Second)
		if n, err := e.store.CleanupTransient(ctx); err != nil || n != 1 {
			t.Fatalf("cleanup: %d %v", n, err)
		}
		if _, err := e.store.Get(ctx, r.JobID); !errors.Is(err, repjob.ErrNotFound) {
			t.Fatalf("after cleanup: %v", err)
		}
	})
}

func TestCrashBackoffDoublesCapsAndHeals(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		p := schedpolicy.DefaultPolicy()
		p.MinBackoff, p.MaxBackoff, p.HealthThreshold = 10*time.Second, 60*time.Second, 2*time.Minute
		e := newEnv(t, func(o *repjob.Options) { o.Policy = p })
		r, err := e.store.AddTransient(ctx, body("http://a/src", "http://b/tgt", `,"continuous":true`), "alice")
		if err != nil {
			t.Fatal(err)
		}
		steps := []struct {
			ranFor      time.Duration
			wantBackoff time.Duration
			wantErrors  int32
		}{
			{time.Second, 10 * time.Second, 1},
			{time.Second, 20 * time.Second, 2},
			{time.Second, 40 * time.Second, 3},
			{time.Second, 60 * time.Second, 4},
			{time.Second, 60 * time.Second, 5},
			{3 * time.Minute, 10 * time.Second, 0}, // healed by a long run: CouchDB counts 0, waits min_backoff
			{time.Second, 10 * time.Second, 1},
			{time.Second, 20 * time.Second, 2},
		}
		for i, st := range steps {
			if i > 0 {
				e.clock.Advance(steps[i-1].wantBackoff - time.Millisecond)
				if _, err := e.store.Accept(ctx, false); !errors.Is(err, jobqueue.ErrNotFound) {
					t.Fatalf("step %d: accepted during backoff (%v)", i, err)
				}
				e.clock.Advance(time.Millisecond)
			}
			run, err := e.store.Accept(ctx, false)
			if err != nil {
				t.Fatalf("step %d: accept after backoff: %v", i, err)
			}
			if err := run.Start(ctx, "n1"); err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(st.ranFor)
			until, err := run.Crash(ctx, "boom")
			if err != nil {
				t.Fatal(err)
			}
			if got := until.Sub(e.clock.Now()); got != st.wantBackoff {
				t.Fatalf("step %d: backoff %v, want %v", i, got, st.wantBackoff)
			}
			rec, _ := e.store.Get(ctx, r.JobID)
			if rec.State() != repjob.StateCrashing || rec.ErrorCount != st.wantErrors ||
				rec.LastError != "boom" {
				t.Fatalf("step %d: %v errors=%d %q", i, rec.State(), rec.ErrorCount, rec.LastError)
			}
		}
	})
}

func TestRepIDCollisions(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		cases := []struct {
			name      string
			ownerKind string
			wantKind  messages.ReplicationKind
		}{
			{"duplicate of a transient job", "transient", messages.ReplicationKind_REPLICATION_KIND_TRANSIENT},
			{"duplicate of a persistent job", "persistent", messages.ReplicationKind_REPLICATION_KIND_PERSISTENT},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				e := newEnv(t, nil)
				b := body("http://a/src", "http://b/tgt", "")
				var owner repjob.AddResult
				var err error
				if c.ownerKind == "transient" {
					owner, err = e.store.AddTransient(ctx, b, "alice")
				} else {
					owner, err = e.store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c", DB: "_replicator", DocID: "x", Body: b})
				}
				if err != nil {
					t.Fatal(err)
				}
				dup, err := e.store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c", DB: "_replicator", DocID: "dup", Body: b})
				if err != nil {
					t.Fatal(err)
				}
				// Take the duplicate from the queue (the owner stays pending).
				var run *repjob.Run
				for {
					r, err := e.store.Accept(ctx, false)
					if err != nil {
						t.Fatal(err)
					}
					if r.ID() == dup.JobID {
						run = r
						break
					}
					if err := r.Start(ctx, "n1"); err != nil {
						t.Fatal(err)
					}
					defer func() { _ = r.Stop(ctx) }()
				}
				if err := run.Start(ctx, "n1"); err != nil {
					t.Fatal(err)
				}
				base, ext, _ := replicate.ID(mustParse(t, b), uuid)
				_, err = run.ClaimRepID(ctx, base, ext, "")
				var d *repjob.Duplicate
				if !errors.As(err, &d) || !errors.Is(err, repjob.ErrDuplicate) || d.OwnerJobID != owner.JobID || d.OwnerKind != c.wantKind {
					t.Fatalf("claim: %v", err)
				}
				// Once the owner is removed the duplicate takes the id over.
				if err := e.store.Remove(ctx, owner.JobID); err != nil {
					t.Fatal(err)
				}
				if _, err := run.ClaimRepID(ctx, base, ext, ""); err != nil {
					t.Fatalf("claim after owner removed: %v", err)
				}
				got, err := e.store.FindByRepID(ctx, base+ext)
				if err != nil || got.JobId != dup.JobID {
					t.Fatalf("FindByRepID: %v %v", got, err)
				}
			})
		}
	})
}

func TestFilterChangeMovesRepID(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		b := body("http://a/src", "http://b/tgt", `,"filter":"d/f"`)
		r, err := e.store.AddTransient(ctx, b, "alice")
		if err != nil || r.RepID != "" {
			t.Fatalf("named filter: rep id %q err %v", r.RepID, err)
		}
		p := mustParse(t, b)
		ids := map[string]string{}
		for i, code := range []string{"function(d){return true}", "function(d){return true}", "function(d){return false}"} {
			run, err := e.store.Accept(ctx, false)
			if err != nil {
				t.Fatal(err)
			}
			if err := run.Start(ctx, "n1"); err != nil {
				t.Fatal(err)
			}
			base, ext, err := replicate.ID(p.WithFilterCode(code), uuid)
			if err != nil {
				t.Fatal(err)
			}
			changed, err := run.ClaimRepID(ctx, base, ext, code)
			if err != nil {
				t.Fatal(err)
			}
			if want := i == 2; changed != want {
				t.Fatalf("run %d: changed=%v", i, changed)
			}
			ids[base+ext] = code
			if err := run.Stop(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if len(ids) != 2 {
			t.Fatalf("rep ids %v", ids)
		}
		for id, code := range ids {
			got, err := e.store.FindByRepID(ctx, id)
			if code == "function(d){return false}" {
				if err != nil || got.JobId != r.JobID || got.FilterCode != code {
					t.Fatalf("new id: %v %v", got, err)
				}
			} else if !errors.Is(err, repjob.ErrNotFound) {
				t.Fatalf("old id still indexed: %v", err)
			}
		}
	})
}

func TestChangesFeed(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		a, _ := e.store.AddTransient(ctx, body("http://a/1", "http://b/1", ""), "u")
		b, _ := e.store.AddTransient(ctx, body("http://a/2", "http://b/2", ""), "u")
		ch, seq, err := e.store.Changes(ctx, "", 0)
		if err != nil || len(ch) != 2 || ch[0].JobID != a.JobID || ch[1].JobID != b.JobID {
			t.Fatalf("initial changes %+v %v", ch, err)
		}
		waited := make(chan error, 1)
		go func() { waited <- e.store.WaitChanges(ctx, seq) }()
		// A progress update is not a change; a removal of a is.
		if err := e.store.Remove(ctx, a.JobID); err != nil {
			t.Fatal(err)
		}
		if err := <-waited; err != nil {
			t.Fatal(err)
		}
		ch, seq2, err := e.store.Changes(ctx, seq, 0)
		if err != nil || len(ch) != 1 || ch[0].JobID != a.JobID || ch[0].Record != nil {
			t.Fatalf("after remove %+v %v", ch, err)
		}
		// Each job appears once, at its newest change.
		ch, _, _ = e.store.Changes(ctx, "", 0)
		if len(ch) != 2 || ch[0].JobID != b.JobID || ch[1].JobID != a.JobID {
			t.Fatalf("full feed %+v", ch)
		}
		if ch, _, _ := e.store.Changes(ctx, seq2, 0); len(ch) != 0 {
			t.Fatalf("nothing new: %+v", ch)
		}
	})
}

func TestFairShareAccountsInStore(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, func(o *repjob.Options) { o.Shares = map[string]int{"big/_replicator": 200, "small/_replicator": 50} })
		prio := map[string][]uint64{}
		for i := range 4 {
			for _, db := range []string{"big/_replicator", "small/_replicator"} {
				r, err := e.store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c", DB: db, DocID: string(rune('a' + i)),
					Body: body("http://a/"+db[:3], "http://b/x"+string(rune('a'+i)), "")})
				if err != nil {
					t.Fatal(err)
				}
				prio[db] = append(prio[db], r.Record.Priority)
			}
		}
		// Deadlines of one key are a quantum·100/shares apart: 4× closer for
		// 200 shares than for 50.
		stepBig := prio["big/_replicator"][1] - prio["big/_replicator"][0]
		stepSmall := prio["small/_replicator"][1] - prio["small/_replicator"][0]
		if stepBig == 0 || stepSmall != 4*stepBig {
			t.Fatalf("steps big %d small %d", stepBig, stepSmall)
		}
		// A second store on the same database (another node) continues the
		// same accounts.
		other := repjob.New(e.q, e.db, repjob.Options{Clock: e.clock, ServerUUID: uuid,
			Shares: map[string]int{"big/_replicator": 200}})
		r, err := other.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c", DB: "big/_replicator", DocID: "z",
			Body: body("http://a/z", "http://b/z", "")})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := r.Record.Priority, prio["big/_replicator"][3]+stepBig; got != want {
			t.Fatalf("other node's priority %d, want %d", got, want)
		}
	})
}

// TestAddInvalidRecordsAFailedJob: an invalid document replaces its running
// job with a failed record that is never accepted and frees the replication
// id; a valid edit makes it a pending job again.
func TestAddInvalidRecordsAFailedJob(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		doc := repjob.PersistentDoc{Server: "http://couch:5984/", DB: "_replicator", DocID: "d1",
			Body: body("http://a/src", "http://b/tgt", "")}
		added, err := e.store.AddPersistent(ctx, doc)
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

		bad := doc
		bad.Body = []byte(`{"source":"http://a/src","target":"http://b/tgt","doc_ids":"d1"}`)
		res, err := e.store.AddInvalid(ctx, bad, "parameter `doc_ids` must be an array")
		if err != nil || res.JobID != added.JobID {
			t.Fatalf("AddInvalid = %+v, %v", res, err)
		}
		if err := run.Progress(ctx, replicate.Stats{}); !repjob.IsLost(err) {
			t.Fatalf("the replaced run's worker kept its job: %v", err)
		}
		rec, err := e.store.Get(ctx, added.JobID)
		if err != nil || rec.State() != repjob.StateFailed ||
			rec.GetLastError() != "parameter `doc_ids` must be an array" || rec.GetDocId() != "d1" {
			t.Fatalf("invalid document's job: %+v %v", rec, err)
		}
		if _, err := e.store.Accept(ctx, false); !errors.Is(err, jobqueue.ErrNotFound) {
			t.Fatalf("a failed record was accepted: %v", err)
		}
		// Its replication id is free: another document may use it.
		other := doc
		other.DocID = "d2"
		if _, err := e.store.AddPersistent(ctx, other); err != nil {
			t.Fatalf("the invalid document still holds the replication id: %v", err)
		}

		// Fixing the document makes it a job again.
		if r, err := e.store.AddPersistent(ctx, doc); err != nil || r.Existed {
			t.Fatalf("valid edit: %+v %v", r, err)
		}
		if rec, _ := e.store.Get(ctx, added.JobID); rec.State() != repjob.StatePending {
			t.Fatalf("after the valid edit: %v", rec.State())
		}
	})
}

// TestSizeLimits: a replication too large for one job record is refused
// at Add naming its largest field (transient and persistent), recorded as
// a failed job when it is an invalid document (without its body), and a
// job whose errors are long keeps being written (errors clipped, oldest
// history dropped) instead of failing its writes.
func TestSizeLimits(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		p := schedpolicy.DefaultPolicy()
		p.MaxHistory = 1000
		p.MinBackoff, p.MaxBackoff = time.Second, time.Second
		e := newEnv(t, func(o *repjob.Options) { o.Policy = p })
		ids := make([]string, 10_000)
		for i := range ids {
			ids[i] = fmt.Sprintf("document-%06d", i)
		}
		idsJSON, _ := json.Marshal(ids)
		big := body("http://a/src", "http://b/tgt", `,"doc_ids":`+string(idsJSON))
		_, err := e.store.AddTransient(ctx, big, "alice")
		var pe *replicate.ParamError
		if !errors.Is(err, repjob.ErrInvalid) || !errors.As(err, &pe) || pe.Field != "doc_ids" {
			t.Fatalf("AddTransient of 10,000 doc_ids: %v, want ErrInvalid naming doc_ids", err)
		}
		doc := repjob.PersistentDoc{Server: "http://couch:5984/", DB: "_replicator", DocID: "big", Body: big}
		if _, err := e.store.AddPersistent(ctx, doc); !errors.Is(err, repjob.ErrInvalid) || !errors.As(err, &pe) || pe.Field != "doc_ids" {
			t.Fatalf("AddPersistent of 10,000 doc_ids: %v, want ErrInvalid naming doc_ids", err)
		}
		res, err := e.store.AddInvalid(ctx, doc, pe.Reason)
		if err != nil {
			t.Fatalf("AddInvalid of a too large document: %v", err)
		}
		rec, err := e.store.Get(ctx, res.JobID)
		if err != nil || rec.State() != repjob.StateFailed || rec.GetLastError() != pe.Reason {
			t.Fatalf("too large document's job: %+v %v", rec, err)
		}

		// A job crashing 120 times with 5 kB errors, history of up to 1,000:
		// its 240 events (started, crashed) would not fit in a record.
		r, err := e.store.AddTransient(ctx, body("http://a/src", "http://b/tgt", `,"continuous":true`), "alice")
		if err != nil {
			t.Fatal(err)
		}
		long := strings.Repeat("é", 2_500)
		const crashes = 120
		for i := range crashes {
			run, err := e.store.Accept(ctx, false)
			if err != nil {
				t.Fatalf("crash %d: accept: %v", i, err)
			}
			if err := run.Start(ctx, "n1"); err != nil {
				t.Fatalf("crash %d: start: %v", i, err)
			}
			if _, err := run.Crash(ctx, fmt.Sprint(i, long)); err != nil {
				t.Fatalf("crash %d: %v", i, err)
			}
			e.clock.Advance(time.Second)
		}
		rec, err = e.store.Get(ctx, r.JobID)
		if err != nil {
			t.Fatal(err)
		}
		last := rec.GetLastError()
		if len(last) > 1_000 || !strings.HasPrefix(last, fmt.Sprint(crashes-1, "é")) || !strings.HasSuffix(last, "…") || !utf8.ValidString(last) {
			t.Fatalf("last error of %d bytes: %.40q…", len(last), last)
		}
		events := rec.GetHistory().GetEvents()
		if len(events) < 20 || len(events) >= 2*crashes || !strings.HasPrefix(events[0].GetReason(), fmt.Sprint(crashes-1, "é")) {
			t.Fatalf("history of %d events (oldest dropped to fit?), newest %.20q", len(events), events[0].GetReason())
		}
	})
}

// TestStopBeforeStartChargesNothing: a run handed back before it started (a
// stop during startup_jitter) ran for nothing: its share account gets back
// the quantum reserved when the job was enqueued and is charged nothing, so
// the job's deadline does not move out, whether it never ran (no last start:
// not the time since the epoch) or an earlier run started an hour ago.
func TestStopBeforeStartChargesNothing(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		added, err := e.store.AddTransient(ctx, body("http://a/s", "http://b/t", ""), "alice")
		if err != nil {
			t.Fatal(err)
		}
		stopUnstarted := func(what string) {
			t.Helper()
			before, err := e.store.Get(ctx, added.JobID)
			if err != nil {
				t.Fatal(err)
			}
			run, err := e.store.Accept(ctx, false)
			if err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(time.Minute) // the startup delay
			if err := run.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			after, err := e.store.Get(ctx, added.JobID)
			if err != nil {
				t.Fatal(err)
			}
			if after.Priority > before.Priority {
				t.Fatalf("%s: deadline %d after a stop before the start, want at most %d (nothing charged)",
					what, after.Priority, before.Priority)
			}
		}
		stopUnstarted("never started")
		runAnHourAgo(t, e)
		stopUnstarted("started an hour ago")
	})
}

// TestRemoveBeforeStartChargesNothing: a job removed (a cancel, a deleted
// _replicator document) after it was accepted but before its run started
// (during startup_jitter) ran for nothing: its share account gets back the
// reserved quantum, as for a pending job, and is not charged the time since
// the epoch (it never ran) or since an earlier run's start. The next job of
// the share gets the deadline the removed one had.
func TestRemoveBeforeStartChargesNothing(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		removeUnstarted := func(what string, startEarlier bool) {
			t.Helper()
			added, err := e.store.AddTransient(ctx, body("http://a/s", "http://b/t", ""), "alice")
			if err != nil {
				t.Fatal(err)
			}
			if startEarlier {
				runAnHourAgo(t, e)
			}
			before, err := e.store.Get(ctx, added.JobID)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Accept(ctx, false); err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(time.Minute) // the startup delay
			if err := e.store.Remove(ctx, added.JobID); err != nil {
				t.Fatal(err)
			}
			next, err := e.store.AddTransient(ctx, body("http://a/s2", "http://b/t2", ""), "alice")
			if err != nil {
				t.Fatal(err)
			}
			after, err := e.store.Get(ctx, next.JobID)
			if err != nil {
				t.Fatal(err)
			}
			if after.Priority > before.Priority {
				t.Fatalf("%s: the share's next deadline is %d after a removal before the start, want at most %d (nothing charged)",
					what, after.Priority, before.Priority)
			}
			if err := e.store.Remove(ctx, next.JobID); err != nil {
				t.Fatal(err)
			}
		}
		removeUnstarted("never started", false)
		removeUnstarted("started an hour before", true)
	})
}

// runAnHourAgo accepts the next due job, starts and stops its run, and
// moves the clock on by an hour.
func runAnHourAgo(t *testing.T, e *env) {
	t.Helper()
	ctx := context.Background()
	run, err := e.store.Accept(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Start(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := run.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour)
}

// TestAcceptWaitsForTheLease: once the store keeps a lease (GoKeepLease),
// a waiting Accept takes jobs only under it, even when it is called before
// the lease is open (a node's acceptor starts with the lease); a job
// accepted outside it would write to the store on its own for as long as
// it runs. Once KeepLease has ended, Accept takes jobs without one.
func TestAcceptWaitsForTheLease(t *testing.T) {
	e := newEnv(t, nil)
	ctx := t.Context()
	for i := range 3 {
		if _, err := e.store.AddTransient(ctx, body(fmt.Sprintf("http://a/s%d", i), "http://b/t", `,"continuous":true`), "alice"); err != nil {
			t.Fatal(err)
		}
	}
	lctx, stop := context.WithCancel(ctx)
	done := e.store.GoKeepLease(lctx)
	for range 2 {
		run, err := e.store.Accept(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		unwatch, leased := run.Watch(func() {}, func() {})
		unwatch()
		if !leased {
			t.Fatalf("job %s accepted outside the node's lease", run.ID())
		}
		leases, err := e.q.Leases(ctx, repjob.JobType)
		if err != nil || len(leases) != 1 || !slices.Contains(leases[0].Jobs, run.ID()) {
			t.Fatalf("leases %+v (%v): want one holding %s", leases, err, run.ID())
		}
	}
	stop()
	<-done
	run, err := e.store.Accept(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if unwatch, leased := run.Watch(func() {}, func() {}); leased {
		unwatch()
		t.Fatalf("job %s accepted under a lease after KeepLease ended", run.ID())
	}
}

// TestAddDoesNotConflictWithStart: adding a job reads the fair-share
// frontier without a read conflict, so a batch of adds (the doc
// processor's, hundreds per transaction) is not aborted and redone by
// every job some node starts meanwhile (each Start raises the frontier).
func TestAddDoesNotConflictWithStart(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		e := newEnv(t, nil)
		ctx := t.Context()
		if _, err := e.store.AddTransient(ctx, body("http://a/s", "http://b/t", `,"continuous":true`), "alice"); err != nil {
			t.Fatal(err)
		}
		run, err := e.store.Accept(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		attempts := 0
		err = e.db.Transact(ctx, func(tx kv.Tx) error {
			attempts++
			for i := range 3 {
				doc := repjob.PersistentDoc{Server: "http://s/", DB: "_replicator", DocID: fmt.Sprintf("d%d", i),
					Body: body(fmt.Sprintf("http://a/u%d", i), "http://b/t", `,"continuous":true`)}
				if _, err := e.store.AddPersistentTx(tx, doc); err != nil {
					return err
				}
			}
			if attempts == 1 {
				// Another node starts a job while the batch is open.
				return run.Start(ctx, "n2")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if attempts != 1 {
			t.Fatalf("the batch of adds ran %d times: a Start meanwhile made it conflict", attempts)
		}
		if r, err := e.store.Get(ctx, run.ID()); err != nil || r.GetNode() != "n2" {
			t.Fatalf("started job: %v %v", r, err)
		}
	})
}

// TestAcceptAfterTheLeaseExpired: when the activity monitor (of any node)
// expired this process's lease, a waiting Accept does not fail with
// ErrLeaseLost (the node's accept loop would back off for up to 10 s, and
// the lease would be replaced only at KeepLease's next round, a third of
// the timeout later): it has KeepLease open another lease at once and
// takes the job under that.
func TestAcceptAfterTheLeaseExpired(t *testing.T) {
	e := newEnv(t, func(o *repjob.Options) { o.ActivityTimeout = time.Hour }) // no renewal during the test
	ctx := t.Context()
	if err := e.q.SetTypeTimeout(ctx, repjob.JobType, time.Hour); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := e.store.AddTransient(ctx, body(fmt.Sprintf("http://a/s%d", i), "http://b/t", `,"continuous":true`), "alice"); err != nil {
			t.Fatal(err)
		}
	}
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	done := e.store.GoKeepLease(lctx)
	defer func() { stop(); <-done }()
	first, err := e.store.Accept(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := e.q.Leases(ctx, repjob.JobType)
	if err != nil || len(leases) != 1 {
		t.Fatalf("leases %+v (%v), want one", leases, err)
	}
	old := leases[0].ID
	// A monitor finds the lease a whole timeout old and re-enqueues its job.
	m := e.q.NewMonitor(jobqueue.MonitorOptions{})
	t0 := time.Now()
	if _, err := m.Check(ctx, t0); err != nil {
		t.Fatal(err)
	}
	if n, err := m.Check(ctx, t0.Add(2*time.Hour)); err != nil || n != 1 {
		t.Fatalf("monitor re-enqueued %d (%v), want the lease's one job", n, err)
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for range 2 {
		run, err := e.store.Accept(actx, true)
		if err != nil {
			t.Fatalf("accept after the lease expired: %v", err)
		}
		unwatch, leased := run.Watch(func() {}, func() {})
		unwatch()
		if !leased {
			t.Fatalf("job %s accepted outside a lease", run.ID())
		}
	}
	leases, err = e.q.Leases(ctx, repjob.JobType)
	if err != nil || len(leases) != 1 || leases[0].ID == old || len(leases[0].Jobs) != 2 {
		t.Fatalf("leases %+v (%v): want one new lease (not %s) holding both jobs", leases, err, old)
	}
	if err := first.Start(ctx, "n1"); !repjob.IsLost(err) {
		t.Fatalf("start under the expired lease's run: %v, want lost", err)
	}
}

// TestAddTransientAs: CouchDB 3.4.3's couch_replicator:check_authorization
// for a POST /_replicate of a replication another user's live job runs: a
// user who is not an admin is refused (ErrOtherUser, nothing changes); an
// admin's POST of the same body is the other user's job (as CouchDB 3.4.3
// keeps it), of another body with the same id replaces it; the owner's
// own POST is the same job; either way one live job has the replication
// id.
func TestAddTransientAs(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		b := body("http://a:5984/src", "http://b:5984/tgt", `,"continuous":true`)
		other := body("http://a:5984/src", "http://b:5984/tgt", `,"continuous":true,"worker_processes":2`)
		joe, err := e.store.AddTransientAs(ctx, b, "joe", false)
		if err != nil {
			t.Fatal(err)
		}
		live := func() []string {
			t.Helper()
			var ids []string
			recs, err := e.store.List(ctx, repjob.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if !r.State().Terminal() {
					ids = append(ids, r.GetUser())
				}
			}
			slices.Sort(ids)
			return ids
		}
		for _, c := range []struct {
			name    string
			body    []byte
			user    string
			admin   bool
			wantErr error
			want    []string
		}{
			{"the owner again: the same job", b, "joe", false, nil, []string{"joe"}},
			{"another user, not an admin: refused", b, "ann", false, repjob.ErrOtherUser, []string{"joe"}},
			{"an admin, the same body: joe's job stays", b, "boss", true, nil, []string{"joe"}},
			{"an admin, other options: replaces joe's job", other, "boss", true, nil, []string{"boss"}},
			{"joe, not an admin, now refused", b, "joe", false, repjob.ErrOtherUser, []string{"boss"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				r, err := e.store.AddTransientAs(ctx, c.body, c.user, c.admin)
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("error %v, want %v", err, c.wantErr)
				}
				if err == nil && r.RepID != joe.RepID {
					t.Fatalf("rep id %q, want %q", r.RepID, joe.RepID)
				}
				if got := live(); !slices.Equal(got, c.want) {
					t.Fatalf("live jobs of users %v, want %v", got, c.want)
				}
			})
		}
	})
}
