package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
)

// TestLagPausedAndFailuresViews: a job that stopped 20 minutes ago with
// changes pending shows a 20-minute lag (info.lag_seconds, the status
// page, couchrep_replication_lag_seconds); a paused job shows as CouchDB
// shows a stopped one (pending, no pid, "stopped" newest) with info.paused,
// counts in couchrep_replication_jobs_paused and not in the lag; refused
// documents are in _scheduler/jobs.
func TestLagPausedAndFailuresViews(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "store.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	clock := schedpolicy.NewFakeClock(time.Now().Add(-20 * time.Minute))
	q := jobqueue.New(db, jobqueue.Options{NodeName: "n1", AcceptSpread: 1, Clock: clock.Now})
	st := repjob.New(q, db, repjob.Options{ServerUUID: uuid, Policy: schedpolicy.DefaultPolicy(), Clock: clock})
	store := httpapi.NewRepjobStore(st, uuid)
	srv := httptest.NewServer(httpapi.New(httpapi.Options{Store: store, Metrics: httpapi.NewMetrics(store)}))
	t.Cleanup(srv.Close)

	stalled, err := st.AddTransient(ctx, []byte(`{"source":"http://a/s","target":"http://b/t","continuous":true}`), "alice")
	if err != nil {
		t.Fatal(err)
	}
	run, err := st.Accept(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Start(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	five := int64(5)
	if err := run.Progress(ctx, replicate.Stats{ChangesPending: &five, CheckpointedSourceSeq: couch.Seq("1"),
		WriteFailures: []replicate.WriteFailure{{ID: "x", Rev: "1-a", Status: 403, Error: "forbidden", Reason: "no", At: clock.Now()}}}); err != nil {
		t.Fatal(err)
	}
	if err := run.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	paused, err := st.AddTransient(ctx, []byte(`{"source":"http://a/p","target":"http://b/t","continuous":true}`), "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pause(ctx, paused.JobID, "n1"); err != nil {
		t.Fatal(err)
	}

	get := func(path string, into any) []byte {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if into != nil {
			if err := json.Unmarshal(b, into); err != nil {
				t.Fatalf("%s: %v %s", path, err, b)
			}
		}
		return b
	}
	var jobs struct {
		Jobs []struct {
			JobID   string           `json:"job_id"`
			State   string           `json:"state"`
			PID     *string          `json:"pid"`
			Info    map[string]any   `json:"info"`
			History []map[string]any `json:"history"`
			Fails   []map[string]any `json:"write_failures"`
		} `json:"jobs"`
	}
	get("/_scheduler/jobs", &jobs)
	if len(jobs.Jobs) != 2 {
		t.Fatalf("_scheduler/jobs: %+v", jobs)
	}
	for _, j := range jobs.Jobs {
		switch j.JobID {
		case stalled.JobID:
			if lag, _ := j.Info["lag_seconds"].(float64); lag < 1190 || j.Info["paused"] != nil {
				t.Fatalf("stalled job's info: %v", j.Info)
			}
			if len(j.Fails) != 1 || j.Fails[0]["id"] != "x" || j.Fails[0]["status"] != 403.0 || j.Fails[0]["reason"] != "no" {
				t.Fatalf("write_failures: %v", j.Fails)
			}
		case paused.JobID:
			if j.State != "pending" || j.PID != nil || j.Info["paused"] != true || j.Info["paused_since"] == nil ||
				j.History[0]["type"] != "stopped" || j.Info["lag_seconds"] != nil {
				t.Fatalf("paused job: %+v", j)
			}
		}
	}
	metrics := string(get("/metrics", nil))
	val := func(name string) float64 {
		t.Helper()
		mm := regexp.MustCompile(name + `\{database="",kind="transient",server=""\} (\S+)`).FindStringSubmatch(metrics)
		if mm == nil {
			t.Fatalf("no %s in /metrics", name)
		}
		v, _ := strconv.ParseFloat(mm[1], 64)
		return v
	}
	if lag := val("couchrep_replication_lag_seconds"); lag < 1190 || lag > 1800 {
		t.Fatalf("couchrep_replication_lag_seconds %v, want ~1200", lag)
	}
	if n := val("couchrep_replication_jobs_paused"); n != 1 {
		t.Fatalf("couchrep_replication_jobs_paused %v", n)
	}
	var status struct {
		Jobs []struct {
			ID     string  `json:"id"`
			Paused bool    `json:"paused"`
			Lag    float64 `json:"lag_seconds"`
		} `json:"jobs"`
	}
	get("/_status/data", &status)
	for _, j := range status.Jobs {
		if j.ID == stalled.JobID && j.Lag < 1190 || j.ID == paused.JobID && (!j.Paused || j.Lag != 0) {
			t.Fatalf("status page job: %+v", j)
		}
	}
}

// TestPausedOneShotAnswers: POST /_replicate of a one-shot replication an
// operator paused answers 409 at once instead of waiting for a resume.
func TestPausedOneShotAnswers(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	body := `{"source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/b"}`
	res, err := e.store.AddTransient(ctx, []byte(body), "admin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Pause(ctx, res.JobID, "n1"); err != nil {
		t.Fatal(err)
	}
	done := make(chan reply, 1)
	go func() { done <- e.post(body) }()
	select {
	case r := <-done:
		assertError(t, r, 409, "conflict", "is paused")
	case <-time.After(30 * time.Second):
		t.Fatal("POST /_replicate of a paused one-shot is still waiting")
	}
}
