// Package takeovertest is a CouchDB-shaped fake of what internal/takeover
// reads (GET /, [replicator] config, _active_tasks, _scheduler/docs,
// _all_dbs, the _local marker documents), for unit tests only: the
// end-to-end tests run real servers (internal/testserver).
package takeovertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// Fake is a fake CouchDB server. Set its fields under Set; a zero answer
// (nil, "") is a 404.
type Fake struct {
	*httptest.Server

	mu sync.Mutex
	// UUID is GET /'s uuid.
	UUID string
	// NodeConfig is GET /_node/_local/_config/replicator's body (CouchDB 2+);
	// OldConfig GET /_config/replicator's (CouchDB 1.x, PouchDB Server).
	NodeConfig, OldConfig string
	// Tasks is GET /_active_tasks's body.
	Tasks string
	// Scheduler is GET /_scheduler/docs's body.
	Scheduler string
	// DBs are GET /_all_dbs.
	DBs []string
	// Markers are marker documents to write (as other stores would) when
	// Set returns, by database.
	Markers map[string]string
	// Status answers every request with this status when set (401: not
	// an admin).
	Status int
	// markers are the _local marker documents by database.
	markers map[string]json.RawMessage
	revs    map[string]int
	// Requests counts requests by path.
	requests map[string]int
}

// New starts a fake with CouchDB 3's answers for a server whose own
// replicator is on (max_jobs 500) and idle.
func New(t testing.TB) *Fake {
	f := &Fake{UUID: "couchdb-uuid", NodeConfig: `{"max_jobs":"500","interval":"60000"}`, Tasks: `[]`,
		Scheduler: `{"total_rows":0,"offset":0,"docs":[]}`, DBs: []string{"_replicator", "_users"},
		markers: map[string]json.RawMessage{}, revs: map[string]int{}, requests: map[string]int{}}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

// Set changes the fake's answers under its lock.
func (f *Fake) Set(fn func(f *Fake)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
	for db, body := range f.Markers {
		f.putMarker(db, body)
	}
	f.Markers = nil
}

// Requests returns how many requests reached path.
func (f *Fake) Requests(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[path]
}

// Marker returns db's marker document ("" when none).
func (f *Fake) Marker(db string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return string(f.markers[db])
}

// PutMarker writes db's marker document as another store would.
func (f *Fake) PutMarker(db, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.putMarker(db, body)
}

func (f *Fake) putMarker(db, body string) {
	f.revs[db]++
	f.markers[db] = withRev(json.RawMessage(body), f.revs[db])
}

func withRev(body json.RawMessage, rev int) json.RawMessage {
	var m map[string]any
	_ = json.Unmarshal(body, &m)
	if m == nil {
		m = map[string]any{}
	}
	m["_id"] = "_local/couchrep-stores"
	m["_rev"] = fmt.Sprintf("0-%d", rev)
	b, _ := json.Marshal(m)
	return b
}

func (f *Fake) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	path := r.URL.EscapedPath()
	f.requests[path]++
	w.Header().Set("Content-Type", "application/json")
	answer := func(body string) {
		if body == "" {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error":"not_found","reason":"missing"}`)
			return
		}
		fmt.Fprint(w, body)
	}
	if f.Status != 0 {
		w.WriteHeader(f.Status)
		fmt.Fprint(w, `{"error":"unauthorized","reason":"You are not a server admin."}`)
		return
	}
	switch path {
	case "/":
		answer(fmt.Sprintf(`{"couchdb":"Welcome","uuid":%q}`, f.UUID))
		return
	case "/_node/_local/_config/replicator":
		answer(f.NodeConfig)
		return
	case "/_config/replicator":
		answer(f.OldConfig)
		return
	case "/_active_tasks":
		answer(f.Tasks)
		return
	case "/_scheduler/docs":
		answer(f.Scheduler)
		return
	case "/_all_dbs":
		b, _ := json.Marshal(f.DBs)
		answer(string(b))
		return
	}
	db, ok := strings.CutSuffix(path, "/_local/couchrep-stores")
	if !ok {
		answer("")
		return
	}
	db, _ = url.PathUnescape(strings.TrimPrefix(db, "/"))
	switch r.Method {
	case http.MethodGet:
		answer(string(f.markers[db]))
	case http.MethodPut:
		var body struct {
			Rev string `json:"_rev"`
		}
		raw := json.RawMessage{}
		if err := json.NewDecoder(r.Body).Decode(&raw); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		_ = json.Unmarshal(raw, &body)
		// As CouchDB 3.4.3 (integration TestCouchDBAnswers): a _local
		// document has no conflicts; whatever _rev "0-N" is sent (none:
		// 0-0), the write wins and is 0-(N+1).
		n := 0
		_, _ = fmt.Sscanf(body.Rev, "0-%d", &n)
		f.revs[db] = n + 1
		f.markers[db] = withRev(raw, f.revs[db])
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"ok":true,"id":"_local/couchrep-stores","rev":"0-%d"}`, f.revs[db])
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}
