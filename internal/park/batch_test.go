package park

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// fakeServer is a server of databases whose update_seq is their name's
// "<name>-seq"; missing ones are not found. noBatch: it answers POST
// /_dbs_info with status (PouchDB Server: 404); fail: every request fails
// with a 500.
type fakeServer struct {
	key     string
	missing map[string]bool
	noBatch int
	fail    bool

	mu      sync.Mutex
	batches [][]string
	singles []string
}

func (s *fakeServer) Key() string { return s.key }

func (s *fakeServer) info(db string) couch.DBsInfoResult {
	if s.missing[db] {
		return couch.DBsInfoResult{Err: &couch.HTTPError{Method: http.MethodGet, URL: "http://h/" + db, Status: http.StatusNotFound, ErrorName: "not_found"}}
	}
	return couch.DBsInfoResult{Info: couch.DBInfo{DBName: db, UpdateSeq: couch.Seq(fmt.Sprintf("%q", db+"-seq"))}}
}

func (s *fakeServer) DBsInfo(_ context.Context, dbs []string) ([]couch.DBsInfoResult, error) {
	s.mu.Lock()
	s.batches = append(s.batches, dbs)
	s.mu.Unlock()
	if s.noBatch != 0 {
		return nil, &couch.HTTPError{Method: http.MethodPost, URL: "http://h/_dbs_info", Status: s.noBatch, ErrorName: "not_found"}
	}
	if s.fail {
		return nil, &couch.HTTPError{Method: http.MethodPost, URL: "http://h/_dbs_info", Status: http.StatusInternalServerError}
	}
	if len(dbs) > couch.MaxDBsInfoKeys {
		return nil, &couch.HTTPError{Method: http.MethodPost, URL: "http://h/_dbs_info", Status: http.StatusBadRequest, ErrorName: "too_many_keys"}
	}
	out := make([]couch.DBsInfoResult, len(dbs))
	for i, db := range dbs {
		out[i] = s.info(db)
	}
	return out, nil
}

func (s *fakeServer) InfoOf(_ context.Context, db string) (couch.DBInfo, error) {
	s.mu.Lock()
	s.singles = append(s.singles, db)
	s.mu.Unlock()
	if s.fail {
		return couch.DBInfo{}, &couch.HTTPError{Method: http.MethodGet, URL: "http://h/" + db, Status: http.StatusInternalServerError}
	}
	x := s.info(db)
	return x.Info, x.Err
}

func (s *fakeServer) counts() (batches []int, singles int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.batches {
		batches = append(batches, len(b))
	}
	return batches, len(s.singles)
}

// answer is what one look got.
type answer struct {
	seq string
	err error
}

// lookAll queues a look of each db on srv and waits for every answer.
func lookAll(t *testing.T, r *Rechecks, srv Server, dbs []string) []answer {
	t.Helper()
	out := make([]answer, len(dbs))
	var wg sync.WaitGroup
	wg.Add(len(dbs))
	for i, db := range dbs {
		r.Look(srv, db, time.Hour, func(info couch.DBInfo, err error) {
			out[i] = answer{seq: string(info.UpdateSeq), err: err}
			wg.Done()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("looks of %s not all answered within a minute", srv.Key())
	}
	return out
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return out
}

// TestRechecksBatchLooks: the looks queued together go as one POST
// /_dbs_info per server and per 100 databases (a database named twice
// once), each look answered with its own database's line (its update_seq,
// or an error matching couch.ErrNotFound); a look alone is a GET /db. A
// server without _dbs_info (404, as PouchDB Server; 401, as CouchDB 3 to a
// user that is not a server admin) is asked once: its looks, those of
// that first batch included, get a GET /db each from then on. A batch that
// fails otherwise (a 500) hands its looks the error and is tried again
// next time.
func TestRechecksBatchLooks(t *testing.T) {
	r := NewRechecks(1000)
	r.SetGather(200 * time.Millisecond)

	big := &fakeServer{key: "big", missing: map[string]bool{"u007": true}}
	dbs := append([]string{"u001"}, names("u", 250)...) // u001 twice in the first batch
	got := lookAll(t, r, big, dbs)
	for i, db := range dbs {
		switch {
		case db == "u007":
			if !errors.Is(got[i].err, couch.ErrNotFound) {
				t.Errorf("look of missing %s: %+v, want not found", db, got[i])
			}
		case got[i].err != nil || got[i].seq != fmt.Sprintf("%q", db+"-seq"):
			t.Errorf("look of %s: %+v, want its own update_seq", db, got[i])
		}
	}
	batches, singles := big.counts()
	if total := sum(batches); len(batches) != 3 || total != 250 || singles != 0 {
		t.Errorf("250 databases (one of them looked at twice): batches %v (%d names), %d GET /db; want 3 batches of at most 100, 250 names, none",
			batches, total, singles)
	}
	for _, n := range batches {
		if n > couch.MaxDBsInfoKeys {
			t.Errorf("a batch of %d databases", n)
		}
	}

	alone := &fakeServer{key: "alone"}
	if a := lookAll(t, r, alone, []string{"solo"}); a[0].err != nil || a[0].seq != `"solo-seq"` {
		t.Errorf("look alone: %+v", a[0])
	}
	if b, s := alone.counts(); len(b) != 0 || s != 1 {
		t.Errorf("a look alone: batches %v, %d GET /db; want one GET /db", b, s)
	}

	for _, status := range []int{http.StatusNotFound, http.StatusUnauthorized} {
		pouch := &fakeServer{key: fmt.Sprint("nobatch-", status), noBatch: status, missing: map[string]bool{"p002": true}}
		for round := range 2 {
			dbs := names("p", 5)
			got := lookAll(t, r, pouch, dbs)
			for i, db := range dbs {
				if db == "p002" {
					if !errors.Is(got[i].err, couch.ErrNotFound) {
						t.Errorf("%d, round %d, missing %s: %+v", status, round, db, got[i])
					}
				} else if got[i].err != nil || got[i].seq != fmt.Sprintf("%q", db+"-seq") {
					t.Errorf("%d, round %d, %s: %+v", status, round, db, got[i])
				}
			}
			batches, singles := pouch.counts()
			if len(batches) != 1 || singles != 5*(round+1) {
				t.Errorf("no _dbs_info (%d), round %d: %d batches tried, %d GET /db; want 1 (the first round's) and %d",
					status, round, len(batches), singles, 5*(round+1))
			}
		}
	}

	failing := &fakeServer{key: "failing", fail: true}
	for round := range 2 {
		for _, a := range lookAll(t, r, failing, names("f", 3)) {
			if a.err == nil {
				t.Errorf("round %d: a look on a failing server answered %+v", round, a)
			}
		}
		if b, s := failing.counts(); len(b) != round+1 || s != 0 {
			t.Errorf("failing server, round %d: batches %v, %d GET /db; want %d batches (tried again), none", round, b, s, round+1)
		}
	}
	if st := r.LookStats(); st.NoBatch != 2 || st.Looks != 251+1+20+6 {
		t.Errorf("stats %+v", st)
	}
}

// TestRechecksLookPaced: the batcher sends one request per pace: the
// looks of 4 servers (a request each) at 20 a second take at least 150 ms,
// and a look waits no longer than half its job's park_recheck for others
// to join it.
func TestRechecksLookPaced(t *testing.T) {
	r := NewRechecks(20)
	r.SetGather(10 * time.Millisecond)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 4 {
		srv := &fakeServer{key: fmt.Sprint("s", i)}
		wg.Add(1)
		go func() { defer wg.Done(); lookAll(t, r, srv, names("d", 2)) }()
	}
	wg.Wait()
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Fatalf("4 requests at 20 a second in %v, want at least 150 ms", took)
	}
	r2 := NewRechecks(1000)
	srv := &fakeServer{key: "quick"}
	start = time.Now()
	done := make(chan struct{})
	r2.Look(srv, "a", 100*time.Millisecond, func(couch.DBInfo, error) { close(done) })
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a look of a job with park_recheck 100 ms unanswered after 30 s")
	}
	if took := time.Since(start); took < 40*time.Millisecond {
		t.Errorf("a look answered after %v: it did not wait for others (half of 100 ms)", took)
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}
