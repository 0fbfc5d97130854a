package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
)

// errStoreDown is what memStore answers when it is down.
var errStoreDown = errors.New("memstore: store unreachable")

// memStore is an in-memory Store whose jobs complete at once: the router
// fuzz target exercises the API, not the job queue. When down, every call
// fails as an unreachable store would.
type memStore struct {
	mu   sync.Mutex
	jobs map[string]*httpapi.Job
	down bool
}

func newMemStore(down bool) *memStore { return &memStore{jobs: map[string]*httpapi.Job{}, down: down} }

func (m *memStore) TransientJobID(body []byte, user string) (string, error) {
	p, err := replicate.ParseParams(body)
	if err != nil {
		return "", err
	}
	return repjob.TransientJobID(p, user, uuid), nil
}

func (m *memStore) AddTransient(_ context.Context, body []byte, user string, _ bool) (*httpapi.Job, error) {
	if m.down {
		return nil, errStoreDown
	}
	p, err := replicate.ParseParams(body)
	if err != nil {
		return nil, err
	}
	id := repjob.TransientJobID(p, user, uuid)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.jobs[id] = &httpapi.Job{JobID: id, RepID: id + "+x", Transient: true, User: user, Source: p.Source.URL,
		Target: p.Target.URL, State: repjob.StateCompleted, Continuous: p.Continuous, CreatedAt: time.Unix(1, 0)}
	c := *m.jobs[id]
	return &c, nil
}

func (m *memStore) Get(_ context.Context, id string) (*httpapi.Job, error) {
	if m.down {
		return nil, errStoreDown
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if j, ok := m.jobs[id]; ok {
		c := *j
		return &c, nil
	}
	return nil, httpapi.ErrNotFound
}

func (m *memStore) FindByRepID(ctx context.Context, repID string) (*httpapi.Job, error) {
	if m.down {
		return nil, errStoreDown
	}
	return m.Get(ctx, strings.TrimSuffix(repID, "+x"))
}

func (m *memStore) List(context.Context) ([]*httpapi.Job, error) {
	if m.down {
		return nil, errStoreDown
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*httpapi.Job
	for _, j := range m.jobs {
		c := *j
		out = append(out, &c)
	}
	return out, nil
}

// SchedulerJobs pages List's unfinished jobs sorted by shown id.
func (m *memStore) SchedulerJobs(ctx context.Context, skip, limit int) ([]*httpapi.Job, int, error) {
	return m.page(ctx, skip, limit, func(j *httpapi.Job) bool { return !j.State.Terminal() }, func(j *httpapi.Job) string {
		if j.RepID != "" {
			return j.RepID
		}
		return j.JobID
	})
}

// SchedulerDocs pages List's persistent jobs sorted by database and doc id.
func (m *memStore) SchedulerDocs(ctx context.Context, db string, skip, limit int) ([]*httpapi.Job, int, error) {
	return m.page(ctx, skip, limit, func(j *httpapi.Job) bool { return !j.Transient && (db == "" || j.Database == db) },
		func(j *httpapi.Job) string { return j.Database + "\x00" + j.DocID })
}

// SchedulerDoc finds the document's job in List.
func (m *memStore) SchedulerDoc(ctx context.Context, db, docID string) (*httpapi.Job, error) {
	all, _, err := m.SchedulerDocs(ctx, db, 0, -1)
	if err != nil {
		return nil, err
	}
	for _, j := range all {
		if j.DocID == docID {
			return j, nil
		}
	}
	return nil, httpapi.ErrNotFound
}

func (m *memStore) page(ctx context.Context, skip, limit int, keep func(*httpapi.Job) bool, key func(*httpapi.Job) string) ([]*httpapi.Job, int, error) {
	all, err := m.List(ctx)
	if err != nil {
		return nil, 0, err
	}
	var out []*httpapi.Job
	for _, j := range all {
		if keep(j) {
			out = append(out, j)
		}
	}
	sort.Slice(out, func(a, b int) bool { return key(out[a]) < key(out[b]) })
	total := len(out)
	out = out[min(skip, total):]
	if limit >= 0 && limit < len(out) {
		out = out[:limit]
	}
	return out, total, nil
}

func (m *memStore) Remove(_ context.Context, id string) error {
	if m.down {
		return errStoreDown
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.jobs[id]; !ok {
		return httpapi.ErrNotFound
	}
	delete(m.jobs, id)
	return nil
}

func (m *memStore) Wait(ctx context.Context, id string, done func(*httpapi.Job) bool) (*httpapi.Job, error) {
	j, err := m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if !done(j) {
		return nil, errors.New("memstore: jobs complete at once")
	}
	return j, nil
}

// FuzzRouter sends any method, path, query, body and content type to the
// API, with or without credentials, over a store that is up or down: it
// never panics, never answers a 5xx other than 503 when the store is
// down, and every error is CouchDB's {"error","reason"} object.
func FuzzRouter(f *testing.F) {
	for _, s := range []struct {
		method, path, query, ctype, body string
		auth, down                       bool
	}{
		{"POST", "/_replicate", "", "application/json", `{"source":"http://u:hunter2@a/db","target":"http://b/db"}`, true, false},
		{"POST", "/_replicate", "", "application/json", `{"source":"http://a/db","target":"http://b/db","continuous":true}`, true, true},
		{"POST", "/_replicate", "", "application/json", `{"replication_id":"x","cancel":true}`, true, false},
		{"POST", "/_replicate", "", "", `{"a":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, true, false},
		{"GET", "/_scheduler/jobs", "limit=2&skip=1", "", "", true, false},
		{"GET", "/_scheduler/jobs/abc", "", "", "", true, true},
		{"GET", "/_scheduler/docs/other%2F_replicator/doc", "states=running,crashing", "", "", true, false},
		{"GET", "/_scheduler/docs", "states=sleeping&limit=-1", "", "", true, false},
		{"HEAD", "/_active_tasks", "", "", "", true, false},
		{"GET", "/_up", "", "", "", false, true},
		{"GET", "/metrics", "", "", "", true, false},
		{"DELETE", "/_replicate", "", "", "", false, false},
		{"GET", "/_scheduler/jobs", "", "", "", false, false},
	} {
		f.Add(s.method, s.path, s.query, s.ctype, []byte(s.body), s.auth, s.down)
	}
	f.Fuzz(func(t *testing.T, method, path, query, ctype string, body []byte, auth, down bool) {
		store := newMemStore(down)
		api := httpapi.New(httpapi.Options{Store: store, Admins: map[string]string{"admin": "pw"}, MaxBodyBytes: 64 << 10})
		req, err := http.NewRequest(method, "http://couchrep.test"+path, bytes.NewReader(body))
		if err != nil || !strings.HasPrefix(path, "/") {
			return // not a request a client can send
		}
		req.URL.RawQuery = query
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if auth {
			req.SetBasicAuth("admin", "pw")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req.WithContext(ctx))
		code := rec.Code
		if code >= 500 && !(code == http.StatusServiceUnavailable && down) {
			t.Fatalf("%s %s?%s (store down %v): %d %s", method, path, query, down, code, rec.Body.Bytes())
		}
		if code >= 400 {
			var e struct {
				Error  *string `json:"error"`
				Reason *string `json:"reason"`
			}
			err := json.Unmarshal(rec.Body.Bytes(), &e)
			// CouchDB answers the cancel of an unknown replication with
			// the error name alone: {"error":"not found"}.
			cancelNotFound := err == nil && e.Error != nil && *e.Error == "not found" && code == http.StatusNotFound && path == "/_replicate"
			if err != nil || e.Error == nil || ((e.Reason == nil || *e.Reason == "") && !cancelNotFound) {
				t.Fatalf("%s %s: %d with a body that is not a CouchDB error: %q", method, path, code, rec.Body.Bytes())
			}
		}
	})
}
