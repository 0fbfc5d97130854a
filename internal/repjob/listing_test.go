package repjob_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/storetest"
	"github.com/couchrep/couchrep/internal/kv/tuple"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
)

// listingJobs fills e's store with jobs in every state: transient and
// persistent (two databases), with and without a replication id (a named
// filter), running, crashed, completed, failed, invalid, canceled (a
// persistent job's cancel is refused and changes nothing), removed,
// and one whose replication id became known as it ran.
func listingJobs(t *testing.T, e *env) {
	t.Helper()
	ctx := context.Background()
	for i := range 12 {
		extra := ""
		if i%4 == 1 {
			extra = `,"filter":"d/f"`
		}
		if _, err := e.store.AddTransient(ctx, body(fmt.Sprintf("http://a/s%02d", i), "http://b/t", extra), "alice"); err != nil {
			t.Fatal(err)
		}
		for _, db := range []string{"_replicator", "other/_replicator"} {
			doc := repjob.PersistentDoc{Server: "http://c/", DB: db, DocID: fmt.Sprintf("doc%02d", 11-i),
				Body: body(fmt.Sprintf("http://a/%s%02d", db[:1], i), "http://b/t", extra)}
			if _, err := e.store.AddPersistent(ctx, doc); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := e.store.AddInvalid(ctx, repjob.PersistentDoc{Server: "http://c/", DB: "_replicator", DocID: "bad",
		Body: []byte(`{}`)}, "Missing `source` field"); err != nil {
		t.Fatal(err)
	}
	// Run some: complete, fail, crash, leave running; claim the replication
	// id of a filtered one (its shown id changes).
	claimed := false
	for i := range 8 {
		run, err := e.store.Accept(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Start(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		if run.Record().GetRepId() == "" && !claimed {
			claimed = true
			if _, err := run.ClaimRepID(ctx, "0000claimed", "+continuous", "function(){}"); err != nil {
				t.Fatal(err)
			}
		}
		switch i % 4 {
		case 0:
			err = run.Complete(ctx, replicate.Result{})
		case 1:
			err = run.Fail(ctx, "gone")
		case 2:
			_, err = run.Crash(ctx, "boom")
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !claimed {
		t.Fatal("no filtered job ran")
	}
	// Cancel a pending persistent job, remove a transient and a persistent.
	recs, err := e.store.List(ctx, repjob.Filter{States: []repjob.State{repjob.StatePending}})
	if err != nil {
		t.Fatal(err)
	}
	canceled, refused, removed := 0, 0, 0
	for _, r := range recs {
		var err error
		switch {
		case r.Kind == messages.ReplicationKind_REPLICATION_KIND_PERSISTENT && refused < 2:
			refused++
			if _, err := e.store.Cancel(ctx, r.GetJobId(), "test"); !errors.Is(err, repjob.ErrDocumentJob) {
				t.Fatalf("cancel of persistent job %s: %v, want ErrDocumentJob", r.GetJobId(), err)
			}
			if got, err := e.store.Get(ctx, r.GetJobId()); err != nil || got.State() != repjob.StatePending || got.Version != r.Version {
				t.Fatalf("persistent job %s after a refused cancel: %v %v", r.GetJobId(), got, err)
			}
		case r.Kind == messages.ReplicationKind_REPLICATION_KIND_TRANSIENT && canceled < 2:
			canceled++
			_, err = e.store.Cancel(ctx, r.GetJobId(), "test")
		case removed < 2:
			removed++
			err = e.store.Remove(ctx, r.GetJobId())
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// wantPage is what a listing must give: the whole list, filtered and
// sorted the way CouchDB does, then paged.
func wantPage(all []*repjob.Record, keep func(*repjob.Record) bool, key func(*repjob.Record) []string, skip, limit int) ([]string, int) {
	var l []*repjob.Record
	for _, r := range all {
		if keep(r) {
			l = append(l, r)
		}
	}
	slices.SortFunc(l, func(a, b *repjob.Record) int { return slices.Compare(key(a), key(b)) })
	total := len(l)
	l = l[min(skip, total):]
	if limit >= 0 {
		l = l[:min(limit, len(l))]
	}
	ids := make([]string, len(l))
	for i, r := range l {
		ids[i] = r.GetJobId()
	}
	return ids, total
}

func pageIDs(p repjob.Page) []string {
	ids := make([]string, len(p.Jobs))
	for i, r := range p.Jobs {
		ids[i] = r.GetJobId()
	}
	return ids
}

// checkListings compares every listing, at every skip and limit, with the
// full list filtered, sorted and paged.
func checkListings(t *testing.T, store *repjob.Store) {
	t.Helper()
	ctx := context.Background()
	all, err := store.List(ctx, repjob.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	live := func(r *repjob.Record) bool { return !r.State().Terminal() }
	shown := func(r *repjob.Record) []string { return []string{repjob.ShownID(r), r.GetJobId()} }
	docs := func(db string) func(r *repjob.Record) bool {
		return func(r *repjob.Record) bool {
			return r.Kind == messages.ReplicationKind_REPLICATION_KIND_PERSISTENT && (db == "" || r.GetDbName() == db)
		}
	}
	docKey := func(r *repjob.Record) []string { return []string{r.GetDbName(), r.GetDocId(), r.GetJobId()} }
	listings := []struct {
		name string
		page func(skip, limit int) (repjob.Page, error)
		keep func(*repjob.Record) bool
		key  func(*repjob.Record) []string
	}{
		{"scheduler jobs", func(s, l int) (repjob.Page, error) { return store.SchedulerJobs(ctx, s, l) }, live, shown},
		{"scheduler docs", func(s, l int) (repjob.Page, error) { return store.SchedulerDocs(ctx, "", s, l) }, docs(""), docKey},
		{"scheduler docs of a db", func(s, l int) (repjob.Page, error) { return store.SchedulerDocs(ctx, "other/_replicator", s, l) },
			docs("other/_replicator"), docKey},
		{"jobs", func(s, l int) (repjob.Page, error) { return store.Jobs(ctx, s, l) },
			func(*repjob.Record) bool { return true }, func(r *repjob.Record) []string { return []string{r.GetJobId()} }},
	}
	// Each document's job by database and document id.
	for _, r := range all {
		if r.Kind != messages.ReplicationKind_REPLICATION_KIND_PERSISTENT {
			continue
		}
		got, err := store.SchedulerDoc(ctx, r.GetDbName(), r.GetDocId())
		if err != nil || got.GetJobId() != r.GetJobId() {
			t.Fatalf("SchedulerDoc(%s, %s) = %v, %v; want %s", r.GetDbName(), r.GetDocId(), got, err, r.GetJobId())
		}
	}
	if _, err := store.SchedulerDoc(ctx, "_replicator", "doc0"); !errors.Is(err, repjob.ErrNotFound) {
		t.Fatalf("SchedulerDoc of a missing document: %v", err)
	}
	for _, l := range listings {
		_, n := wantPage(all, l.keep, l.key, 0, -1)
		if n < 5 {
			t.Fatalf("%s: only %d jobs to list", l.name, n)
		}
		for _, skip := range []int{0, 1, 3, n - 1, n, n + 5} {
			for _, limit := range []int{-1, 0, 1, 2, 7, n} {
				got, err := l.page(skip, limit)
				if err != nil {
					t.Fatal(err)
				}
				want, total := wantPage(all, l.keep, l.key, skip, limit)
				if got.Total != total || !slices.Equal(pageIDs(got), want) {
					t.Fatalf("%s skip=%d limit=%d: total %d %v, want %d %v", l.name, skip, limit, got.Total, pageIDs(got), total, want)
				}
			}
		}
	}
}

// TestListingPages: a page of _scheduler/jobs, _scheduler/docs and
// couchrepctl jobs read from the listing indexes is the full list, filtered,
// sorted as CouchDB sorts it and paged, with the full list's total_rows,
// after jobs went through every state; and a store written before the
// indexes existed gets them at Init.
func TestListingPages(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		e := newEnv(t, nil)
		listingJobs(t, e)
		checkListings(t, e.store)

		// A store written before the indexes: drop them; a new Store
		// (another node, or this one restarted) builds them at Init.
		ctx := context.Background()
		root := tuple.NewSubspace(nil, tuple.Tuple{"repjob"})
		if err := e.db.Transact(ctx, func(tx kv.Tx) error {
			for tag := 10; tag <= 14; tag++ {
				tx.ClearRange(root.Sub(tag).Range())
				tx.Clear(root.Pack(tuple.Tuple{tag}))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		q := jobqueue.New(e.db, jobqueue.Options{Clock: e.clock.Now, NodeName: "n2"})
		fresh := repjob.New(q, e.db, repjob.Options{Clock: e.clock, ServerUUID: uuid, Policy: schedpolicy.DefaultPolicy()})
		checkListings(t, fresh)
	})
}
