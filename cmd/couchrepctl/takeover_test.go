package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/messages"
)

func TestPrintTakeover(t *testing.T) {
	for _, tc := range []struct {
		name  string
		r     *messages.TakeoverResponse
		want  []string
		never []string
	}{
		{"refused", &messages.TakeoverResponse{Server: "http://h:5984/", Node: "n1", StoreId: "abc", Checks: []*messages.TakeoverCheck{
			{Name: "uuid", Result: "ok", Found: "the node uses the server's uuid u"},
			{Name: "replicator", Result: "fail", Found: "[replicator] max_jobs = 500", Next: "set [replicator] max_jobs = 0"},
			{Name: "tasks", Result: "unknown", Found: "GET /_active_tasks answered 401", Next: "watch with server-admin credentials"},
		}}, []string{
			"takeover of http://h:5984/, checked by node n1 (job store abc):",
			"  ok      uuid         the node uses the server's uuid u\n",
			"  fail    replicator   [replicator] max_jobs = 500\n                       next: set [replicator] max_jobs = 0\n",
			"  unknown tasks        GET /_active_tasks answered 401\n                       next: watch with server-admin credentials\n",
			"refused: 2 of 3 preconditions not met",
		}, []string{"ready"}},
		{"ready", &messages.TakeoverResponse{Server: "http://h:5984/", Node: "n1", StoreId: "abc", Ready: true, Checks: []*messages.TakeoverCheck{
			{Name: "uuid", Result: "ok", Found: "fine"},
		}}, []string{"ready: every precondition is met; node n1 runs the jobs of the _replicator documents of http://h:5984/ alone"}, []string{"next:", "refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printTakeover(&b, tc.r)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tc.never {
				if strings.Contains(b.String(), w) {
					t.Errorf("output has %q:\n%s", w, b.String())
				}
			}
		})
	}
}

func TestTakeoverUsage(t *testing.T) {
	if _, errOut, code := ctl("takeover"); code != exitUsage || !strings.Contains(errOut, "takes the server's URL") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

func TestCompetingLine(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		c    *messages.CompetingReplicatorCheck
		want string
	}{
		{&messages.CompetingReplicatorCheck{Server: "http://h/", Status: "competing", Action: "warn", ServerWide: true, Reason: "its own replicator is on: [replicator] max_jobs = 500 (/_node/_local/_config/replicator)"},
			"competing replicator on http://h/: its own replicator is on: [replicator] max_jobs = 500 (/_node/_local/_config/replicator); warning only (on_competing_replicator = warn): both copy the same writes\n" +
				`  next: stop it: curl -u ADMIN -X PUT http://h/_node/_local/_config/replicator/max_jobs -d '"0"' (on every node of a cluster; couchrepctl takeover http://h/ checks every precondition)`},
		{&messages.CompetingReplicatorCheck{Server: "http://h/", Status: "competing", Action: "refuse", ServerWide: true, StoppedJobs: 3, Reason: "its own replicator is on: [replicator] max_jobs = 500 (/_node/_local/_config/replicator)"},
			"competing replicator on http://h/: its own replicator is on: [replicator] max_jobs = 500 (/_node/_local/_config/replicator); couchrep stopped 3 job(s) of its _replicator documents and starts none while it runs (on_competing_replicator = refuse); they resume from their checkpoints once it stops\n" +
				`  next: stop it: curl -u ADMIN -X PUT http://h/_node/_local/_config/replicator/max_jobs -d '"0"' (on every node of a cluster; couchrepctl takeover http://h/ checks every precondition)`},
		{&messages.CompetingReplicatorCheck{Server: "http://h/", Status: "competing", Action: "refuse", Reason: "another couchrep store follows _replicator: store s (node n)",
			OtherStores: []string{"store s (node n)"}, Databases: []*messages.CompetingDatabase{{Db: "_replicator", Since: timestamppb.New(now.Add(-time.Minute))}}},
			"competing replicator on http://h/: another couchrep store follows _replicator: store s (node n); databases: _replicator (0 running job(s), for 1m0s); couchrep runs no job of its _replicator documents while it runs (on_competing_replicator = refuse); they resume from their checkpoints once it stops\n" +
				"  next: stop the other store's nodes, or remove http://h/ from their [couchrep] watch"},
		{&messages.CompetingReplicatorCheck{Server: "http://h/", Status: "competing", Action: "refuse", Reason: "the server's scheduler runs 2 document(s) of _replicator",
			Databases: []*messages.CompetingDatabase{{Db: "_replicator", Jobs: 2, Since: timestamppb.New(now.Add(-time.Minute))}}},
			"competing replicator on http://h/: the server's scheduler runs 2 document(s) of _replicator; databases: _replicator (2 running job(s), for 1m0s); couchrep runs no job of its _replicator documents while it runs (on_competing_replicator = refuse); they resume from their checkpoints once it stops\n" +
				"  next: wait until the server's replicator has stopped its jobs (its next rescheduling); couchrepctl takeover http://h/ checks every precondition"},
		{&messages.CompetingReplicatorCheck{Server: "http://h/", Status: "unknown", Reason: "no max_jobs"}, "competing replicator on http://h/: unknown: no max_jobs"},
	} {
		if got := competingLine(tc.c, now); got != tc.want {
			t.Errorf("got  %q\nwant %q", got, tc.want)
		}
	}
}
