package couch_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/testserver"
)

// specialIDs are document IDs whose escaping has gone wrong in replicators.
var specialIDs = []string{"a/b", "a b", "ü", "a+b", "100%", "q?x=1&y#z", "_design/x"}

// pouchSource starts a pouchdb-server with a source database holding
// conflicts, a tombstone, attachments and awkward IDs.
func pouchSource(t *testing.T) (*testserver.Server, *couch.DB) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts pouchdb-server")
	}
	s := testserver.StartPouchDB(t)
	src := s.CreateDB(t, "source")
	docs := []map[string]any{
		testserver.Doc("conflicted", []string{"2-bbb", "1-aaa"}, map[string]any{"v": "b"}),
		testserver.Doc("conflicted", []string{"2-ccc", "1-aaa"}, map[string]any{"v": "c"}),
		testserver.Deleted(testserver.Doc("conflicted", []string{"3-ddd", "2-eee", "1-aaa"}, nil)),
		testserver.Deleted(testserver.Doc("gone", []string{"2-zzz", "1-yyy"}, nil)),
		testserver.WithAttachment(testserver.Doc("with-att", []string{"1-att"}, map[string]any{"k": 1}), "hello.txt", "text/plain", []byte("hello, world")),
	}
	for i, id := range specialIDs {
		docs = append(docs, testserver.Doc(id, []string{fmt.Sprintf("1-%03d", i)}, map[string]any{"i": i}))
	}
	s.PutRevs(t, src, docs...)
	return s, db(t, src)
}

func db(t *testing.T, rawURL string) *couch.DB {
	t.Helper()
	ep, err := couch.ParseEndpoint(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	// A transport of the test's own, its connections closed when the test
	// ends: a server the tests did not start (make test-couchdb) does not
	// close them by exiting, and goleak would count them.
	tr, err := couch.NewTransport(couch.TransportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return couch.NewDB(ep, couch.Options{Retries: 2, RetryBackoff: 10 * time.Millisecond, HTTPClient: &http.Client{Transport: tr}})
}

// leaves lists every id's leaf revisions from the changes feed.
func leaves(t *testing.T, d *couch.DB) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	_, err := d.Changes(context.Background(), couch.ChangesOptions{Style: couch.StyleAllDocs}, func(c couch.Change) error {
		revs := append([]string(nil), c.Revs...)
		sort.Strings(revs)
		out[c.ID] = revs
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPouchDBInfoAndCreate(t *testing.T) {
	s, src := pouchSource(t)
	ctx := context.Background()
	si, err := src.ServerInfo(ctx)
	if err != nil || si.UUID == "" || si.Version == "" {
		t.Fatalf("ServerInfo = %+v, %v", si, err)
	}
	info, err := src.Info(ctx)
	if err != nil || !strings.HasSuffix(info.DBName, "source") || info.InstanceStartTime == "" {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	// PouchDB Server counts one seq per stored revision; CouchDB (make
	// test-couchdb) one per document update.
	if n, ok := seqPrefix(info.UpdateSeq); !ok || (!s.External() && n != int64(5+len(specialIDs))) {
		t.Errorf("update_seq = %s, want the integer %d", info.UpdateSeq, 5+len(specialIDs))
	}
	if err := src.Create(ctx, nil); !errors.Is(err, couch.ErrExists) {
		t.Errorf("Create existing = %v, want ErrExists", err)
	}
	missing := db(t, s.DBURL("missing"))
	if _, err := missing.Info(ctx); !errors.Is(err, couch.ErrNotFound) {
		t.Errorf("Info of a missing db = %v, want ErrNotFound", err)
	}
	if err := missing.Create(ctx, nil); err != nil {
		t.Errorf("Create = %v", err)
	}
	if ist, err := src.EnsureFullCommit(ctx); err != nil || ist != info.InstanceStartTime {
		t.Errorf("EnsureFullCommit = %q, %v; want %q", ist, err, info.InstanceStartTime)
	}
}

// TestPouchDBDBsInfo: POST /_dbs_info (DBsInfo) answers each database as
// GET /db (InfoOf, Info) does — update_seq, db_name — and a missing one
// with an error matching ErrNotFound, in the order asked, on Apache
// CouchDB 3.4.3 (make test-couchdb); more than MaxDBsInfoKeys are refused
// before a request. PouchDB Server has no _dbs_info: 404 (the batched
// rechecks' cue to fall back to GET /db).
func TestPouchDBDBsInfo(t *testing.T) {
	s, src := pouchSource(t)
	ctx := context.Background()
	s.CreateDB(t, "other")
	s.PutDocs(t, s.DBURL("other"), map[string]any{"_id": "x"})
	name := func(dbURL string) string {
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Trim(u.Path, "/")
	}
	names := []string{name(s.DBURL("other")), name(s.DBURL("missing")), name(s.DBURL("source"))}
	res, err := src.DBsInfo(ctx, names)
	if !s.External() {
		var he *couch.HTTPError
		if !errors.As(err, &he) || he.Status != http.StatusNotFound {
			t.Fatalf("PouchDB Server: DBsInfo = %v, %v; want a 404", res, err)
		}
		return
	}
	if err != nil || len(res) != 3 {
		t.Fatalf("DBsInfo = %+v, %v", res, err)
	}
	for i, n := range names {
		one, err := src.InfoOf(ctx, n)
		if i == 1 {
			if !errors.Is(res[i].Err, couch.ErrNotFound) || !errors.Is(err, couch.ErrNotFound) {
				t.Errorf("missing %s: DBsInfo %+v, InfoOf %v: want not found from both", n, res[i], err)
			}
			continue
		}
		if err != nil || res[i].Err != nil || res[i].Info.DBName != n || one.DBName != n ||
			!res[i].Info.UpdateSeq.Equal(one.UpdateSeq) || res[i].Info.InstanceStartTime != one.InstanceStartTime {
			t.Errorf("%s: DBsInfo %+v, InfoOf %+v, %v: want the same info", n, res[i], one, err)
		}
	}
	if info, err := src.Info(ctx); err != nil || !info.UpdateSeq.Equal(res[2].Info.UpdateSeq) {
		t.Errorf("Info %+v, %v; DBsInfo's update_seq %s", info, err, res[2].Info.UpdateSeq)
	}
	if _, err := src.DBsInfo(ctx, make([]string, couch.MaxDBsInfoKeys+1)); err == nil {
		t.Error("DBsInfo of 101 databases: no error")
	}
}

func TestPouchDBChanges(t *testing.T) {
	s, src := pouchSource(t)
	ctx := context.Background()
	all := leaves(t, src)
	want := map[string][]string{
		"conflicted": {"2-bbb", "2-ccc", "3-ddd"},
		"gone":       {"2-zzz"},
		"with-att":   {"1-att"},
	}
	for i, id := range specialIDs {
		want[id] = []string{fmt.Sprintf("1-%03d", i)}
	}
	if fmt.Sprint(all) != fmt.Sprint(want) {
		t.Fatalf("all_docs leaves = %v\nwant %v", all, want)
	}

	var rows []couch.Change
	last, err := src.Changes(ctx, couch.ChangesOptions{Limit: 3}, func(c couch.Change) error { rows = append(rows, c); return nil })
	if err != nil || len(rows) != 3 || !last.Equal(rows[2].Seq) {
		t.Fatalf("limit 3: %d rows, last %s, %v", len(rows), last, err)
	}
	var rest int
	end, err := src.Changes(ctx, couch.ChangesOptions{Since: last}, func(couch.Change) error { rest++; return nil })
	if err != nil || rest != len(want)-3 {
		t.Fatalf("since %s: %d rows, %v; want %d", last, rest, err, len(want)-3)
	}
	// Its last_seq is where the feed ends: nothing after it. The same
	// sequence as a full read's last_seq where a range has one copy; on a
	// CouchDB cluster each read encodes the copies it read (opaque, not
	// comparable between reads).
	cluster := s.Clustered(t)
	if !cluster && !end.Equal(lastSeq(t, src)) {
		t.Fatalf("since %s: last_seq %s, a full read's %s", last, end, lastSeq(t, src))
	}
	if n := rowsSince(t, src, end); n != 0 {
		t.Fatalf("since the last_seq %s: %d rows, want none", end, n)
	}

	ids := map[string]bool{}
	_, err = src.Changes(ctx, couch.ChangesOptions{DocIDs: []string{"a/b", "ü", "nope"}}, func(c couch.Change) error { ids[c.ID] = true; return nil })
	if err != nil || len(ids) != 2 || !ids["a/b"] || !ids["ü"] {
		t.Fatalf("doc_ids: %v, %v", ids, err)
	}

	// A named JavaScript filter with query_params. "==": pouchdb-server
	// JSON-parses query values (2, not "2"); CouchDB passes strings.
	s.PutDocs(t, s.DBURL("source"), map[string]any{
		"_id":     "_design/app",
		"filters": map[string]any{"by_i": "function(doc, req) { return doc.i == req.query.i; }"},
	})
	ids = map[string]bool{}
	_, err = src.Changes(ctx, couch.ChangesOptions{Filter: "app/by_i", QueryParams: map[string]string{"i": "2"}}, func(c couch.Change) error { ids[c.ID] = true; return nil })
	if err != nil || len(ids) != 1 || !ids[specialIDs[2]] {
		t.Fatalf("named filter: %v, %v", ids, err)
	}

	// pouchdb-server ignores timeout= on longpoll: the client's own timer ends it.
	now, _ := src.Info(ctx)
	n := 0
	lp, err := src.Changes(ctx, couch.ChangesOptions{Feed: couch.FeedLongpoll, Since: now.UpdateSeq, Timeout: 200 * time.Millisecond}, func(couch.Change) error { n++; return nil })
	if err != nil || n != 0 || (!cluster && !seqPrefixEq(lp, now.UpdateSeq)) {
		t.Fatalf("idle longpoll: %d rows, last %s, %v; want none and %s", n, lp, err, now.UpdateSeq)
	}
	if n := rowsSince(t, src, lp); n != 0 {
		t.Fatalf("since the idle longpoll's last_seq %s: %d rows, want none", lp, n)
	}
}

// rowsSince counts the rows of a normal feed since seq.
func rowsSince(t *testing.T, d *couch.DB, since couch.Seq) int {
	t.Helper()
	n := 0
	if _, err := d.Changes(context.Background(), couch.ChangesOptions{Since: since}, func(couch.Change) error { n++; return nil }); err != nil {
		t.Fatalf("changes since %s: %v", since, err)
	}
	return n
}

// lastSeq returns the feed's last_seq.
func lastSeq(t *testing.T, d *couch.DB) couch.Seq {
	t.Helper()
	last, err := d.Changes(context.Background(), couch.ChangesOptions{}, func(couch.Change) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	return last
}

func TestPouchDBContinuous(t *testing.T) {
	s, src := pouchSource(t)
	info, err := src.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make(chan couch.Change, 10)
	done := make(chan error, 1)
	go func() {
		_, err := src.Changes(ctx, couch.ChangesOptions{Feed: couch.FeedContinuous, Since: info.UpdateSeq, Heartbeat: 100 * time.Millisecond, Style: couch.StyleAllDocs},
			func(c couch.Change) error {
				got <- c
				if len(got) == 2 {
					return errStop
				}
				return nil
			})
		done <- err
	}()
	// Written after the feed is open (or not; since= makes either order work).
	s.PutDocs(t, s.DBURL("source"), map[string]any{"_id": "live"}, map[string]any{"_id": "last"})
	if err := <-done; !errors.Is(err, errStop) {
		t.Fatalf("continuous feed ended with %v", err)
	}
	close(got)
	var ids []string
	for c := range got {
		ids = append(ids, c.ID)
	}
	sort.Strings(ids)
	if strings.Join(ids, ",") != "last,live" {
		t.Fatalf("continuous rows %v", ids)
	}
}

var errStop = errors.New("stop")

func TestPouchDBReplicateByHand(t *testing.T) {
	s, src := pouchSource(t)
	ctx := context.Background()
	tgtURL := s.CreateDB(t, "target")
	tgt := db(t, tgtURL)
	want := leaves(t, src)

	diff, err := tgt.RevsDiff(ctx, want)
	if err != nil || len(diff) != len(want) {
		t.Fatalf("RevsDiff = %d ids, %v; want %d", len(diff), err, len(want))
	}
	var reqs []couch.BulkGetRequest
	for id, d := range diff {
		for _, rev := range d.Missing {
			reqs = append(reqs, couch.BulkGetRequest{ID: id, Rev: rev})
		}
	}
	// With stubs only (what the replicator asks first), the attachment's
	// stub says how long it is.
	err = src.BulkGet(ctx, reqs, func(d couch.Doc) error {
		if d.ID != "with-att" {
			return nil
		}
		stubs, err := d.Stubs()
		if err != nil || len(stubs) != 1 || stubs[0].Inline || stubs[0].Length != int64(len("hello, world")) {
			t.Errorf("with-att stubs %+v, %v; want one stub of %d bytes", stubs, err, len("hello, world"))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("BulkGet: %v", err)
	}
	var docs []json.RawMessage
	fetched := map[string]bool{}
	err = src.BulkGetWithData(ctx, reqs, func(d couch.Doc) error {
		fetched[d.ID+" "+d.Rev] = true
		if d.ID == "with-att" && (!d.HasAttachments || !strings.Contains(string(d.Body), base64.StdEncoding.EncodeToString([]byte("hello, world")))) {
			t.Errorf("with-att body lacks inline data: %s", d.Body)
		}
		docs = append(docs, d.Body)
		return nil
	})
	if err != nil || len(fetched) != len(reqs) {
		t.Fatalf("BulkGet fetched %d of %d: %v", len(fetched), len(reqs), err)
	}
	res, err := tgt.BulkDocs(ctx, docs, false)
	if err != nil || len(res) != 0 {
		t.Fatalf("BulkDocs = %+v, %v", res, err)
	}
	got := leaves(t, tgt)
	if s.Clustered(t) {
		// _changes reads one copy per range; the write was acknowledged by
		// 2 of 3: read again until the copies agree (a minute at most).
		for deadline := time.Now().Add(time.Minute); fmt.Sprint(got) != fmt.Sprint(want) && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond) // polling the copies' catching up
			got = leaves(t, tgt)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("target leaves %v\nwant %v", got, want)
	}
	again, err := tgt.RevsDiff(ctx, want)
	if err != nil || len(again) != 0 {
		t.Fatalf("RevsDiff after copy = %v, %v", again, err)
	}

	// OpenRevs (the fallback) for every special ID: escaping round-trips.
	for i, id := range specialIDs {
		var got []couch.Doc
		if err := src.OpenRevs(ctx, id, []string{fmt.Sprintf("1-%03d", i)}, nil, func(d couch.Doc) error { got = append(got, d); return nil }); err != nil {
			t.Fatalf("OpenRevs(%q): %v", id, err)
		}
		if len(got) != 1 || got[0].ID != id {
			t.Fatalf("OpenRevs(%q) = %+v", id, got)
		}
	}
	var conflicted []string
	if err := src.OpenRevs(ctx, "conflicted", []string{"2-bbb", "2-ccc", "3-ddd"}, []string{"1-aaa"}, func(d couch.Doc) error {
		conflicted = append(conflicted, fmt.Sprintf("%s:%v", d.Rev, d.Deleted))
		return nil
	}); err != nil || len(conflicted) != 3 {
		t.Fatalf("OpenRevs conflicted = %v, %v", conflicted, err)
	}
	// pouchdb-server answers 200 [{"missing":...}] for an unknown doc
	// (CouchDB: 404); either way nothing is delivered.
	n := 0
	if err := src.OpenRevs(ctx, "no-such-doc", []string{"1-a"}, nil, func(couch.Doc) error { n++; return nil }); (err != nil && !errors.Is(err, couch.ErrNotFound)) || n != 0 {
		t.Fatalf("OpenRevs of a missing doc = %d docs, %v", n, err)
	}
}

func TestPouchDBPutDocMultipart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server")
	}
	s := testserver.StartPouchDB(t)
	tgtURL := s.CreateDB(t, "target")
	tgt := db(t, tgtURL)
	data := []byte(strings.Repeat("0123456789abcdef", 64<<10)) // 1 MiB
	doc := couch.Doc{
		ID: "big att/ü", Rev: "2-b2",
		Body: json.RawMessage(`{"_id":"big att/ü","_rev":"2-b2","_revisions":{"start":2,"ids":["b2","a1"]},"v":1,` +
			`"_attachments":{"blob.bin":{"content_type":"application/octet-stream","length":` + fmt.Sprint(len(data)) + `,"follows":true}}}`),
		HasAttachments: true,
		Attachments:    []couch.Attachment{{Name: "blob.bin", ContentType: "application/octet-stream", Data: data}},
	}
	if err := tgt.PutDoc(context.Background(), doc); err != nil {
		t.Fatal(err)
	}
	got := s.Do(t, http.MethodGet, tgtURL+url.PathEscape(doc.ID)+"/blob.bin", nil, http.StatusOK)
	if string(got) != string(data) {
		t.Fatalf("attachment round trip: %d bytes, want %d", len(got), len(data))
	}
	var stored map[string]any
	s.GetJSON(t, tgtURL+url.PathEscape(doc.ID)+"?revs=true", &stored)
	if stored["_rev"] != "2-b2" || stored["v"] != float64(1) {
		t.Fatalf("stored %v", stored)
	}
	if err := tgt.PutDoc(context.Background(), couch.Doc{ID: "plain", Body: json.RawMessage(`{"_id":"plain","_rev":"1-x"}`)}); err != nil {
		t.Fatalf("JSON PutDoc: %v", err)
	}
}

func TestPouchDBLocalDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server")
	}
	s := testserver.StartPouchDB(t)
	d := db(t, s.CreateDB(t, "db"))
	ctx := context.Background()
	if _, err := d.GetLocal(ctx, "cp"); !errors.Is(err, couch.ErrNotFound) {
		t.Fatalf("GetLocal missing = %v", err)
	}
	rev, err := d.PutLocal(ctx, "cp", json.RawMessage(`{"session_id":"s1","source_last_seq":5}`))
	if err != nil || rev == "" {
		t.Fatalf("PutLocal = %q, %v", rev, err)
	}
	if _, err := d.PutLocal(ctx, "_local/cp", json.RawMessage(`{"session_id":"s2"}`)); !s.External() && !errors.Is(err, couch.ErrConflict) {
		t.Fatalf("PutLocal without _rev = %v, want ErrConflict", err)
	}
	if _, err := d.PutLocal(ctx, "cp", json.RawMessage(`{"_rev":"`+rev+`","session_id":"s2"}`)); err != nil {
		t.Fatal(err)
	}
	b, err := d.GetLocal(ctx, "cp")
	var got struct {
		SessionID string `json:"session_id"`
	}
	if err != nil || json.Unmarshal(b, &got) != nil || got.SessionID != "s2" {
		t.Fatalf("GetLocal = %s, %v", b, err)
	}
	if _, err := d.GetLocal(ctx, "cp"); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkPouchDBCopy copies 10,000 documents of about 1 KiB between two
// pouchdb-servers with this client, strictly one request at a time, in
// batches of 500: _changes page, _revs_diff, _bulk_get, _bulk_docs. This
// is the reference's "ceiling serial" measured through our client; the
// reference measured 3,500-4,200 docs/s with raw requests.
func BenchmarkPouchDBCopy(b *testing.B) {
	const n, batch = 10000, 500
	src := testserver.StartPouchDB(b)
	tgtSrv := testserver.StartPouchDB(b)
	srcURL := src.CreateDB(b, "source")
	for i := 0; i < n; i += batch {
		docs := make([]map[string]any, 0, batch)
		for j := i; j < i+batch; j++ {
			docs = append(docs, testserver.Doc(fmt.Sprintf("doc-%06d", j), []string{fmt.Sprintf("1-%032x", j)}, map[string]any{"pad": strings.Repeat("x", 900)}))
		}
		src.PutRevs(b, srcURL, docs...)
	}
	ctx := context.Background()
	sdb := benchDB(b, srcURL)
	b.ResetTimer()
	for i := range b.N {
		tgtURL := tgtSrv.CreateDB(b, fmt.Sprintf("target%d", i))
		tdb := benchDB(b, tgtURL)
		var since couch.Seq
		copied := 0
		for copied < n {
			revs := map[string][]string{}
			last, err := sdb.Changes(ctx, couch.ChangesOptions{Since: since, Limit: batch, Style: couch.StyleAllDocs}, func(c couch.Change) error {
				revs[c.ID] = c.Revs
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			since = last
			diff, err := tdb.RevsDiff(ctx, revs)
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]couch.BulkGetRequest, 0, len(diff))
			for id, d := range diff {
				for _, r := range d.Missing {
					reqs = append(reqs, couch.BulkGetRequest{ID: id, Rev: r})
				}
			}
			docs := make([]json.RawMessage, 0, len(reqs))
			if err := sdb.BulkGet(ctx, reqs, func(d couch.Doc) error { docs = append(docs, d.Body); return nil }); err != nil {
				b.Fatal(err)
			}
			if _, err := tdb.BulkDocs(ctx, docs, false); err != nil {
				b.Fatal(err)
			}
			copied += len(docs)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "docs/s")
}

func benchDB(b *testing.B, rawURL string) *couch.DB {
	ep, err := couch.ParseEndpoint(rawURL)
	if err != nil {
		b.Fatal(err)
	}
	return couch.NewDB(ep, couch.Options{Retries: 2})
}

func seqPrefix(q couch.Seq) (int64, bool) {
	if n, ok := q.Int(); ok {
		return n, true
	}
	str := strings.Trim(string(q), "\"")
	n, err := strconv.ParseInt(strings.SplitN(str, "-", 2)[0], 10, 64)
	return n, err == nil
}

func seqPrefixEq(a, b couch.Seq) bool {
	x, ok1 := seqPrefix(a)
	y, ok2 := seqPrefix(b)
	return ok1 && ok2 && x == y
}
