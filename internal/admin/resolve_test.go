package admin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
)

func TestActorNameIsJobrunners(t *testing.T) {
	for _, id := range []string{"", "abc", "http://h:5984|_replicator|d/1"} {
		if got, want := ActorName(id), jobrunner.Name(id); got != want {
			t.Errorf("ActorName(%q) = %s, jobrunner.Name %s", id, got, want)
		}
	}
}

// TestFindJob: every way a user names a job (what couchrepctl jobs, the
// status page, _scheduler/jobs and couchrepctl tree show, and a URL with
// its password) finds it; an ambiguous prefix names the jobs it matches;
// no error holds a password.
func TestFindJob(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "store.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st := repjob.New(jobqueue.New(db, jobqueue.Options{}), db, repjob.Options{ServerUUID: "u", Policy: schedpolicy.DefaultPolicy()})
	const server = "http://admin:*****@h1:5984" // the watch entry as docproc keys it (redacted)
	body := func(tgt string) []byte {
		return []byte(fmt.Sprintf(`{"source":"http://admin:secret@h1:5984/src","target":"http://admin:secret@h1:5984/%s","continuous":true}`, tgt))
	}
	a, err := st.AddPersistent(ctx, repjob.PersistentDoc{Server: server, DB: "_replicator", DocID: "backup", Body: body("a")})
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.AddPersistent(ctx, repjob.PersistentDoc{Server: server, DB: "_replicator", DocID: "backup2", Body: body("b")})
	if err != nil {
		t.Fatal(err)
	}
	// The doc processor's key: the server URL without userinfo.
	c, err := st.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://h3:5984", DB: "_replicator", DocID: "backup", Body: body("c")})
	if err != nil {
		t.Fatal(err)
	}
	// The one-shot replication of a's pair: the same base, no extension.
	once, err := st.AddPersistent(ctx, repjob.PersistentDoc{Server: server, DB: "_replicator", DocID: "once",
		Body: []byte(`{"source":"http://admin:secret@h1:5984/src","target":"http://admin:secret@h1:5984/a"}`)})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := st.AddTransient(ctx, body("c"), "admin")
	if err != nil {
		t.Fatal(err)
	}
	if a.RepID == "" || tr.RepID == "" {
		t.Fatalf("replication ids not computed: %q %q", a.RepID, tr.RepID)
	}
	base, _, _ := strings.Cut(a.RepID, "+")
	bBase, _, _ := strings.Cut(b.RepID, "+")
	if once.RepID != base || repjob.ShortRepID(once.RepID) == repjob.ShortRepID(a.RepID) {
		t.Fatalf("one-shot %q and continuous %q of one pair: short ids %q and %q", once.RepID, a.RepID,
			repjob.ShortRepID(once.RepID), repjob.ShortRepID(a.RepID))
	}
	for _, tc := range []struct {
		name, id, want string
	}{
		{"job id as shown", a.JobID, a.JobID},
		{"job id with the password", "http://admin:secret@h1:5984|_replicator|backup", a.JobID},
		{"job id with the password and a slash", "http://admin:secret@h1:5984/|_replicator|backup", a.JobID},
		{"replication id", a.RepID, a.JobID},
		{"replication id without extension", bBase, b.JobID},
		{"status page's short id of the continuous one", repjob.ShortRepID(a.RepID), a.JobID},
		{"status page's short id of the one-shot", repjob.ShortRepID(once.RepID), once.JobID},
		{"one-shot's replication id", once.RepID, once.JobID},
		{"transient job id", tr.JobID, tr.JobID},
		{"transient job id prefix", tr.JobID[:8], tr.JobID},
		{"actor name", ActorName(b.JobID), b.JobID},
		{"unique prefix with the password", "http://admin:secret@h1:5984|_replicator|backup2", b.JobID},
		{"plain server, id with the password", "http://admin:secret@h3:5984|_replicator|backup", c.JobID},
		{"plain server, id with the password and a slash", "http://admin:secret@h3:5984/|_replicator|backup", c.JobID},
		{"spaces around", "  " + tr.JobID + "\n", tr.JobID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := FindJob(ctx, st, tc.id)
			if err != nil {
				t.Fatalf("FindJob(%q): %v", tc.id, err)
			}
			if rec.GetJobId() != tc.want {
				t.Fatalf("FindJob(%q) = %s, want %s", tc.id, rec.GetJobId(), tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name, id string
		want     error
		says     []string
	}{
		{"ambiguous prefix", "http://admin:secret@h1:5984|_replicator|back", ErrAmbiguousJob, []string{"matches 2 jobs", a.JobID, b.JobID}},
		{"too short", "ht", ErrNoSuchJob, []string{"at least 4 characters"}},
		{"unknown", "http://admin:secret@h2:5984|_replicator|backup", ErrNoSuchJob, []string{"h2:5984"}},
		{"unknown actor", "job-0000000000000000", ErrNoSuchJob, nil},
		{"empty", "", ErrNoSuchJob, []string{"no job id given"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FindJob(ctx, st, tc.id)
			if !errors.Is(err, tc.want) {
				t.Fatalf("FindJob(%q): %v, want %v", tc.id, err, tc.want)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error %q holds the password", err)
			}
		})
	}
}
