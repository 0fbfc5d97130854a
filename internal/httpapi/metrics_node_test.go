package httpapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/supervisor"
)

// metricValue reads one series' value from the metrics' registry.
func metricValue(t *testing.T, m *httpapi.Metrics, name, labels string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			var got []string
			for _, l := range s.GetLabel() {
				got = append(got, l.GetName()+"="+l.GetValue())
			}
			if strings.Join(got, ",") != labels {
				continue
			}
			switch {
			case s.Counter != nil:
				return s.GetCounter().GetValue()
			case s.Gauge != nil:
				return s.GetGauge().GetValue()
			case s.Histogram != nil:
				return float64(s.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s{%s}", name, labels)
	return 0
}

type metricWant struct {
	name, labels string
	want         float64
}

func checkMetrics(t *testing.T, m *httpapi.Metrics, wants []metricWant) {
	t.Helper()
	for _, w := range wants {
		if got := metricValue(t, m, w.name, w.labels); got != w.want {
			t.Errorf("%s{%s} = %v, want %v", w.name, w.labels, got, w.want)
		}
	}
}

func TestTransportCountsRequestsResponsesAndBytes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/busy":
			w.WriteHeader(http.StatusTooManyRequests)
		case "/gone":
			w.WriteHeader(http.StatusNotFound)
		case "/boom":
			w.WriteHeader(http.StatusBadGateway)
		default:
			_, _ = io.WriteString(w, "0123456789")
		}
	}))
	defer srv.Close()
	m := httpapi.NewMetrics(nil)
	client := &http.Client{Transport: m.Transport(nil)}
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/ok", ""}, {"POST", "/ok", "abcd"}, {"GET", "/busy", ""}, {"GET", "/gone", ""}, {"PUT", "/boom", ""}, {"PROPFIND", "/ok", ""},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if _, err := client.Get("http://127.0.0.1:1/"); err == nil {
		t.Fatal("a request to port 1 succeeded")
	}
	checkMetrics(t, m, []metricWant{
		{"couchrep_replication_requests_total", "method=GET", 4},
		{"couchrep_replication_requests_total", "method=POST", 1},
		{"couchrep_replication_requests_total", "method=other", 1},
		{"couchrep_replication_responses_total", "outcome=success", 3},
		{"couchrep_replication_responses_total", "outcome=rate_limited", 1},
		{"couchrep_replication_responses_total", "outcome=client_error", 1},
		{"couchrep_replication_responses_total", "outcome=server_error", 1},
		{"couchrep_replication_responses_total", "outcome=transport_error", 1},
		{"couchrep_replication_transferred_bytes_total", "direction=sent", 4},
		{"couchrep_replication_transferred_bytes_total", "direction=received", 30},
		{"couchrep_replication_rate_limited_total", "", 1},
	})
}

func TestJobEngineAndSupervisorMetrics(t *testing.T) {
	m := httpapi.NewMetrics(nil)
	c := func(read, written, failures, missing, checked int64) httpapi.JobCounters {
		return httpapi.JobCounters{DocsRead: read, DocsWritten: written, DocWriteFailures: failures, MissingRevisionsFound: missing, RevisionsChecked: checked}
	}
	// Job a resumes with 100 docs from an earlier run, makes progress and
	// completes; job b crashes before any progress (a failed start); job c
	// crashes after progress; job d is taken over from CouchDB (its
	// checkpoint's 10,250 docs restored) and crashes having copied
	// nothing, as restarted job e with 4,302: the stats the jobs carry are
	// not counted, only their runs' work (ObserveCounted).
	m.ObserveJob("a", repjob.StateRunning, false, c(100, 100, 0, 100, 100))
	m.ObserveCounted("a", c(50, 40, 2, 50, 60))
	m.ObserveJob("a", 0, true, c(150, 140, 2, 150, 160))
	m.ObserveCounted("a", c(50, 50, 1, 50, 50))
	m.ObserveJob("a", repjob.StateCompleted, false, c(200, 190, 3, 200, 210))
	m.ObserveJob("b", repjob.StateRunning, false, c(0, 0, 0, 0, 0))
	m.ObserveJob("b", repjob.StateCrashing, false, c(0, 0, 0, 0, 0))
	m.ObserveJob("c", repjob.StateRunning, false, c(0, 0, 0, 0, 0))
	m.ObserveCounted("c", c(5, 5, 0, 5, 5))
	m.ObserveJob("c", 0, true, c(5, 5, 0, 5, 5))
	m.ObserveJob("c", repjob.StateCrashing, false, c(5, 5, 0, 5, 5))
	m.ObserveJob("d", repjob.StateRunning, false, c(0, 0, 0, 0, 0))
	m.ObserveJob("d", 0, true, c(10250, 10250, 0, 10250, 10250))
	m.ObserveJob("d", repjob.StateCrashing, false, c(10250, 10250, 0, 10250, 10250))
	m.ObserveJob("e", repjob.StatePending, false, c(4302, 4302, 0, 4302, 4302))
	m.ObserveJob("e", repjob.StateRunning, false, c(0, 0, 0, 0, 0))
	m.ObserveJob("e", 0, true, c(4302, 4302, 0, 4302, 4302))
	for _, e := range []replicate.Event{replicate.EventCheckpointRecorded, replicate.EventCheckpointRecorded,
		replicate.EventCheckpointFailed, replicate.EventChangesReadFailed} {
		m.ObserveEngine(e)
	}
	for _, e := range []*supervisor.Event{
		{Kind: supervisor.ChildExited, Supervisor: "couchrep_sup/job_server/jobs_sup", Child: "job-1", Reason: "killed"},
		{Kind: supervisor.ChildExited, Supervisor: "couchrep_sup/job_server/jobs_sup", Child: "job-2", Reason: "normal"},
		{Kind: supervisor.ChildExited, Supervisor: "couchrep_sup", Child: "scheduler", Reason: "killed"},
		{Kind: supervisor.ChildRestarted, Supervisor: "couchrep_sup", Child: "scheduler"},
		{Kind: supervisor.StartFailed, Supervisor: "couchrep_sup", Child: "http_api"},
	} {
		m.ObserveSupervisor(e)
	}
	checkMetrics(t, m, []metricWant{
		{"couchrep_replication_docs_read_total", "", 105},
		{"couchrep_replication_docs_written_total", "", 95},
		{"couchrep_replication_doc_write_failures_total", "", 3},
		{"couchrep_replication_missing_revisions_found_total", "", 105},
		{"couchrep_replication_revisions_checked_total", "", 115},
		{"couchrep_replication_failed_starts_total", "", 2},
		{"couchrep_replication_job_transitions_total", "state=crashing", 3},
		{"couchrep_replication_checkpoints_total", "outcome=success", 2},
		{"couchrep_replication_checkpoints_total", "outcome=failure", 1},
		{"couchrep_replication_changes_read_failures_total", "", 1},
		{"couchrep_replication_worker_deaths_total", "", 1},
		{"couchrep_actor_restarts_total", "child=scheduler,supervisor=couchrep_sup", 1},
		{"couchrep_actor_start_failures_total", "", 1},
	})
	// Names follow Prometheus' conventions: counters end in _total,
	// histograms are in seconds.
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "couchrep_") {
			continue
		}
		switch mf.GetType().String() {
		case "COUNTER":
			if !strings.HasSuffix(name, "_total") {
				t.Errorf("counter %s does not end in _total", name)
			}
		case "HISTOGRAM":
			if !strings.HasSuffix(name, "_seconds") {
				t.Errorf("histogram %s is not in seconds", name)
			}
		}
	}
}
