package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/messages"
)

// TestShortSeq: STARTED_FROM shows a sequence's number part, never a
// CouchDB sequence's 300 characters.
func TestShortSeq(t *testing.T) {
	long := "12345-g1AAAAJneJzLYWBgYMpgTmEQTM4vTc5ISXIwNDLXMwBCwxygFFMiQ5L8____szKYExlygQLsiWZJlolJSZjKcRqRxwIkGRqA1H-oSYFgkxLNjJMMDNMwdWQBAHI" + strings.Repeat("A", 200)
	for _, tc := range []struct{ in, want string }{
		{`"` + long + `"`, "12345"},
		{long, "12345"},
		{`42`, "42"},
		{`"0"`, "0"},
		{`[7,"g1AAAA"]`, "7"},
		{`"abcdefghijklmnopqrstuvwxyz"`, "abcdefghijklmno…"},
		{``, ""},
	} {
		if got := ShortSeq(tc.in); got != tc.want {
			t.Errorf("ShortSeq(%.40q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	got := startedFrom(&messages.JobStats{StartFrom: "couchdb_checkpoint", StartSeq: `"` + long + `"`})
	if got != "couchdb_checkpoint@12345" {
		t.Fatalf("startedFrom = %q", got)
	}
}

// TestPrintJobNow: a stop says what happened, also when the scheduler
// started the job again at once.
func TestPrintJobNow(t *testing.T) {
	for _, tc := range []struct {
		done   string
		status messages.JobStatus
		want   string
	}{
		{"stopped", messages.JobStatus_JOB_STATUS_RUNNING, "stopped job j1: it checkpointed and went back to the queue, and node n1 started it again at once"},
		{"stopped", messages.JobStatus_JOB_STATUS_PENDING, "stopped job j1: it checkpointed and is back in the queue (pending)"},
		{"restarted", messages.JobStatus_JOB_STATUS_RUNNING, "restarted job j1: running on node n1"},
		{"restarted", messages.JobStatus_JOB_STATUS_PENDING, "restarted job j1: due now (pending)"},
		{"restarted", messages.JobStatus_JOB_STATUS_COMPLETED, "restarted job j1: it is completed now"},
		// Made due, not started yet: its record still says crashing.
		{"restarted", messages.JobStatus_JOB_STATUS_CRASHING, "restarted job j1: due now, its backoff skipped"},
	} {
		var b strings.Builder
		if err := printJobNow(&b, tc.done, &messages.JobSummary{Id: "j1", Node: "n1", Status: tc.status}); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(b.String(), tc.want) || strings.Contains(b.String(), "now running") {
			t.Errorf("%s %s: %q, want %q", tc.done, tc.status, b.String(), tc.want)
		}
	}
}

// TestAwaitRestart: job restart reports the state the job reaches, not
// the crashing state it still shows the moment it is made due.
func TestAwaitRestart(t *testing.T) {
	job := func(st messages.JobStatus, errs uint32) *messages.JobSummary {
		return &messages.JobSummary{Id: "j1", Node: "n1", Status: st, ErrorCount: errs, Error: "boom"}
	}
	crashing, running, pending := messages.JobStatus_JOB_STATUS_CRASHING, messages.JobStatus_JOB_STATUS_RUNNING, messages.JobStatus_JOB_STATUS_PENDING
	for _, tc := range []struct {
		name  string
		seen  []*messages.JobSummary // what the polls answer, the last one repeated
		want  messages.JobStatus
		again bool
	}{
		{"starts", []*messages.JobSummary{job(crashing, 2), job(running, 2)}, running, false},
		{"crashes again", []*messages.JobSummary{job(crashing, 2), job(crashing, 3)}, crashing, true},
		{"no free slot", []*messages.JobSummary{job(pending, 0)}, pending, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			polls := 0
			get := func(context.Context, string) (*messages.JobSummary, error) {
				polls++
				return tc.seen[min(polls, len(tc.seen)-1)], nil
			}
			j, again := awaitRestart(context.Background(), tc.seen[0], time.Second, get)
			if j.GetStatus() != tc.want || again != tc.again {
				t.Fatalf("awaitRestart: %s again=%v after %d polls, want %s again=%v", j.GetStatus(), again, polls, tc.want, tc.again)
			}
		})
	}
	if j, _ := awaitRestart(context.Background(), job(running, 0), time.Second, nil); j.GetStatus() != running {
		t.Fatalf("a running job: %s", j.GetStatus())
	}
}

// TestPrintJobNamesServerAndActor: job show links the ids a user meets:
// the server of a document's job and the actor name tree shows.
func TestPrintJobNamesServerAndActor(t *testing.T) {
	var b strings.Builder
	j := &messages.JobSummary{Id: "http://couch-a:5984|_replicator|backup", Database: "_replicator", DocId: "backup",
		Node: "n1", Status: messages.JobStatus_JOB_STATUS_RUNNING}
	if err := printJob(&b, j); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"server", "http://couch-a:5984", "actor", admin.ActorName(j.GetId())} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("job show lacks %q:\n%s", want, b.String())
		}
	}
}
