package testserver

import (
	"net/http"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStartPouchDB(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server")
	}
	s := StartPouchDB(t)
	db := s.CreateDB(t, "harness")
	s.PutRevs(t, db,
		Doc("a", []string{"2-b", "1-a"}, map[string]any{"v": 1}),
		Doc("a", []string{"2-c", "1-a"}, map[string]any{"v": 2}),
		Deleted(Doc("gone", []string{"1-x"}, nil)),
		WithAttachment(Doc("att", []string{"1-y"}, nil), "f.txt", "text/plain", []byte("hello")),
	)
	var info struct {
		DocCount int `json:"doc_count"`
	}
	s.GetJSON(t, db, &info)
	if info.DocCount != 2 { // pouchdb-server has no doc_del_count
		t.Fatalf("doc_count %d, want 2", info.DocCount)
	}
	var tomb map[string]any
	s.GetJSON(t, db+"gone?rev=1-x", &tomb)
	if tomb["_deleted"] != true {
		t.Fatalf("gone?rev=1-x = %v, want a tombstone", tomb)
	}
	var leaves []map[string]any
	s.GetJSON(t, db+"a?open_revs=all", &leaves)
	if len(leaves) != 2 {
		t.Fatalf("open_revs=all gave %d leaves, want 2: %v", len(leaves), leaves)
	}
	got := s.Do(t, http.MethodGet, db+"att/f.txt", nil, http.StatusOK)
	if string(got) != "hello" {
		t.Fatalf("attachment = %q", got)
	}
	rev := s.PutDocs(t, db, map[string]any{"_id": "new"})[0]
	rev2 := s.PutAttachment(t, db, "new", rev, "b.bin", "application/octet-stream", []byte{1, 2, 3})
	if rev2 == rev || rev2 == "" {
		t.Fatalf("PutAttachment rev %q after %q", rev2, rev)
	}
	s.Stop()
	select {
	case <-s.Exited():
	default:
		t.Fatal("Stop returned before the process exited")
	}
	if s.Crashed() {
		t.Fatal("a stopped server counts as crashed")
	}
}

// TestExternalServer: with COUCHREP_TEST_COUCH_URL set, StartPouchDB starts
// nothing and hands out that server, the test's databases named with a
// prefix of their own and deleted when the test ends (`make test-couchdb`).
// A PouchDB Server stands in for the user's CouchDB here.
func TestExternalServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server")
	}
	real := StartPouchDB(t)
	t.Setenv(ExternalURLEnv, real.URL)
	var created string
	t.Run("a test on the external server", func(t *testing.T) {
		s := StartPouchDB(t)
		if !s.External() || s.URL != real.URL {
			t.Fatalf("StartPouchDB gave %s (external %v), want the external %s", s.URL, s.External(), real.URL)
		}
		db := s.CreateDB(t, "harness")
		created = strings.TrimSuffix(strings.TrimPrefix(db, real.URL), "/")
		if !strings.HasPrefix(created, "couchrep-test-") || !strings.HasSuffix(created, "-harness") || db != s.DBURL("harness") {
			t.Errorf("database %q: want couchrep-test-<random>-harness, the same through DBURL", created)
		}
		s.PutDocs(t, db, map[string]any{"_id": "a"})
		if got := s.DBURL("_replicator"); got != real.URL+"_replicator/" {
			t.Errorf("DBURL(_replicator) = %s: system databases keep their names", got)
		}
		s.Stop()
		if s.Crashed() {
			t.Error("an external server counts as crashed")
		}
	})
	if _, status, err := real.do(http.MethodGet, real.DBURL(created), nil); err != nil || status != http.StatusNotFound {
		t.Errorf("GET %s after the test: %d %v, want 404 (deleted)", created, status, err)
	}
}
