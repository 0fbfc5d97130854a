package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// clusterDocs builds n documents named prefix0000… for PutRevs: every
// 10th with a 2 KB attachment, every 100th (7, 107, …) with an 80 KB one
// (written with a multipart PUT), every 50th (3, 53, …) in conflict (two
// branches at generation 2), every 40th (5, 45, …) deleted.
func clusterDocs(prefix string, n int) []map[string]any {
	var docs []map[string]any
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("%s%04d", prefix, i)
		d := testserver.Doc(id, []string{"1-a" + id}, map[string]any{"i": i, "s": strings.Repeat("v", 200)})
		switch {
		case i%100 == 7:
			testserver.WithAttachment(d, "big.bin", "application/octet-stream", bytes.Repeat([]byte(id), 80000/len(id)))
		case i%10 == 0:
			testserver.WithAttachment(d, "a.txt", "text/plain", bytes.Repeat([]byte(id+" "), 2000/(len(id)+1)))
		}
		docs = append(docs, d)
		switch {
		case i%50 == 3:
			docs = append(docs,
				testserver.Doc(id, []string{"2-b" + id, "1-a" + id}, map[string]any{"side": "b"}),
				testserver.Doc(id, []string{"2-c" + id, "1-a" + id}, map[string]any{"side": "c"}))
		case i%40 == 5:
			docs = append(docs, testserver.Deleted(testserver.Doc(id, []string{"2-d" + id, "1-a" + id}, nil)))
		}
	}
	return docs
}

// putClusterDocs writes docs through s in batches (a cluster answers 202
// when not every copy was written: a node is down).
func putClusterDocs(t *testing.T, s *testserver.Server, db string, docs []map[string]any) {
	t.Helper()
	for len(docs) > 0 {
		n := min(200, len(docs))
		body, status, err := s.Request(http.MethodPost, db+"_bulk_docs", map[string]any{"new_edits": false, "docs": docs[:n]})
		if err != nil || (status != http.StatusCreated && status != http.StatusAccepted) {
			t.Fatalf("_bulk_docs: %d %.300s %v", status, body, err)
		}
		docs = docs[n:]
	}
}

// dbCounts is a database's doc_count and doc_del_count.
func dbCounts(s *testserver.Server, db string) (int64, int64, bool) {
	b, status, err := s.Request(http.MethodGet, db, nil)
	var info struct {
		Docs    int64 `json:"doc_count"`
		Deleted int64 `json:"doc_del_count"`
	}
	if err != nil || status != http.StatusOK || json.Unmarshal(b, &info) != nil {
		return 0, 0, false
	}
	return info.Docs, info.Deleted, true
}

// TestCouchDBClusterNodeDown (issue 32): a continuous replication run by
// couchrepd from one database of an Apache CouchDB cluster (q=4, n=3;
// read through node 1) to another (written through node 2) while node 3
// is stopped and started again: 3,200 documents with attachments (2 KB
// inline, 80 KB multipart), conflicts and deletions. While node 3 is
// down, the job copies everything written meanwhile (CouchDB serves: 2 of
// 3 copies make its quorum), its docs_read and docs_written never go
// backwards, and in the end the target holds exactly the source's leaves.
// Needs COUCHREP_TEST_COUCH_CLUSTER and COUCHREP_TEST_COUCH_CLUSTER_CMD
// (make test-couchdb COUCH_CLUSTER=… COUCH_CLUSTER_CMD=…).
func TestCouchDBClusterNodeDown(t *testing.T) {
	skipShort(t)
	c := testserver.CouchCluster(t)
	if len(c.Nodes) < 3 {
		t.Fatalf("the cluster lists %d nodes, want 3 (one stopped, two serving)", len(c.Nodes))
	}
	n1, n2 := c.Nodes[0], c.Nodes[1]
	src := n1.CreateDB(t, "cluster-src")
	n1.CreateDB(t, "cluster-tgt")
	tgt := n2.DBURL("cluster-tgt")
	putClusterDocs(t, n1, src, clusterDocs("a", 1500))

	dir := t.TempDir()
	node := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, liveConfig)})
	addr := node.httpAddr("")
	r := api(t, addr, "POST", "/_replicate", fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true,"checkpoint_interval":2000}`, src, tgt))
	id, _ := r.obj(t)["_local_id"].(string)
	if r.status != http.StatusAccepted || id == "" {
		t.Fatalf("POST continuous: %d %s", r.status, r.body)
	}

	// Every sample of the job's counters, checked to never go backwards.
	var mu sync.Mutex
	var lastRead, lastWritten int64
	var backwards []string
	sample := func() (read, written int64, state string) {
		var job struct {
			State string `json:"state"`
			Info  struct {
				DocsRead    int64 `json:"docs_read"`
				DocsWritten int64 `json:"docs_written"`
			} `json:"info"`
		}
		rep := apiNoFail("http://" + addr + "/_scheduler/jobs/" + id)
		if rep.status != http.StatusOK || json.Unmarshal(rep.body, &job) != nil {
			return -1, -1, ""
		}
		mu.Lock()
		defer mu.Unlock()
		if job.Info.DocsRead < lastRead || job.Info.DocsWritten < lastWritten {
			backwards = append(backwards, fmt.Sprintf("docs_read %d -> %d, docs_written %d -> %d (%s)", lastRead, job.Info.DocsRead, lastWritten, job.Info.DocsWritten, job.State))
		}
		lastRead, lastWritten = max(lastRead, job.Info.DocsRead), max(lastWritten, job.Info.DocsWritten)
		return job.Info.DocsRead, job.Info.DocsWritten, job.State
	}
	caughtUp := func() bool {
		sample()
		sd, sdel, ok1 := dbCounts(n1, src)
		td, tdel, ok2 := dbCounts(n2, tgt)
		return ok1 && ok2 && sd == td && sdel == tdel
	}

	waitUntil(t, "the job to copy the first 1,500 documents", 3*time.Minute, caughtUp)
	_, w0, _ := sample()

	// Node 3 goes down; writes go on through node 1.
	c.Stop(t, 3)
	down := time.Now()
	putClusterDocs(t, n1, src, clusterDocs("b", 1500))
	waitUntil(t, "the job to copy the 1,500 documents written while node 3 is down", 3*time.Minute, caughtUp)
	_, w1, state := sample()
	t.Logf("node 3 down: %d more revisions written in %v (job %s)", w1-w0, time.Since(down).Round(time.Millisecond), state)
	if w1 <= w0 {
		t.Errorf("docs_written %d while node 3 was down, %d before: no progress", w1, w0)
	}

	c.Start(t, 3)
	putClusterDocs(t, n1, src, clusterDocs("c", 200))
	waitUntil(t, "the job to copy the documents written after node 3 is back", 3*time.Minute, caughtUp)
	api(t, addr, "POST", "/_replicate", `{"replication_id":"`+id+`","cancel":true}`)

	mu.Lock()
	if len(backwards) > 0 {
		t.Errorf("the job's counters went backwards: %v", backwards)
	}
	mu.Unlock()
	verify(t, n1, n2, src, tgt, nil)
}
