package repjob_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv/storetest"
	"github.com/couchrep/couchrep/internal/repjob"
)

// TestFollowerNamesTheJobsWritten: after a full read, a Follower asks for
// nothing while no job is written, and then for the jobs written (a start),
// added and removed since, with few others (those of the same generation
// shards), on every backend.
func TestFollowerNamesTheJobsWritten(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		add := func(i int) string {
			t.Helper()
			r, err := e.store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c", DB: "_replicator", DocID: fmt.Sprint("d", i),
				Body: body(fmt.Sprintf("http://a/s%d", i), "http://b/central", `,"continuous":true`)})
			if err != nil {
				t.Fatal(err)
			}
			return r.Record.GetJobId()
		}
		var all []string
		for i := range 60 {
			all = append(all, add(i))
		}
		f := e.store.NewFollower(time.Hour)
		full, _, err := f.Next(ctx)
		if err != nil || !full {
			t.Fatalf("first Next: full %t, %v; want every job", full, err)
		}
		f.Reset()
		for _, id := range all {
			f.Seen(id)
		}
		f.Commit()
		next := func(what string) []string {
			t.Helper()
			full, ids, err := f.Next(ctx)
			if err != nil || full {
				t.Fatalf("%s: full %t, %v", what, full, err)
			}
			for _, id := range ids {
				if slices.Contains(all, id) {
					f.Seen(id)
				} else {
					f.Gone(id)
				}
			}
			f.Commit()
			return ids
		}
		if ids := next("at rest"); len(ids) != 0 {
			t.Fatalf("at rest: %v, want nothing", ids)
		}
		run, err := e.store.Accept(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Start(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		// What the count of running jobs per node reads: the node of a
		// running job, "" for the others.
		nodes, err := e.store.JobNodes(ctx)
		if err != nil || len(nodes) != 60 || nodes[run.Record().GetJobId()] != "n1" || nodes[all[0]] != "" && all[0] != run.Record().GetJobId() {
			t.Fatalf("JobNodes: %d jobs, %v", len(nodes), err)
		}
		some, err := e.store.JobNodesOf(ctx, []string{run.Record().GetJobId(), "no-such-job"})
		if err != nil || len(some) != 1 || some[run.Record().GetJobId()] != "n1" {
			t.Fatalf("JobNodesOf: %v, %v", some, err)
		}
		ids := next("after a start")
		if !slices.Contains(ids, run.Record().GetJobId()) || len(ids) > 6 {
			t.Fatalf("after a start: %d ids %v; want %s and its shard's few", len(ids), ids, run.Record().GetJobId())
		}
		added := add(100)
		all = append(all, added)
		if ids := next("after an add"); !slices.Contains(ids, added) || len(ids) > 6 {
			t.Fatalf("after an add: %v; want %s", ids, added)
		}
		if err := e.store.Remove(ctx, all[3]); err != nil {
			t.Fatal(err)
		}
		gone := all[3]
		all = slices.Delete(all, 3, 4)
		if ids := next("after a removal"); !slices.Contains(ids, gone) {
			t.Fatalf("after a removal: %v; want %s", ids, gone)
		}
		if ids := next("at rest again"); len(ids) != 0 {
			t.Fatalf("at rest again: %v", ids)
		}
	})
}
