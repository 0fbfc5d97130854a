package replicate

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeCouch is a small CouchDB-shaped server for unit tests: databases of
// single-leaf documents, opaque string seqs ("N-fake") and
// instance_start_time "0" as CouchDB 3 has, _changes (normal feed, with
// doc_ids and _selector filters on top-level equality), _revs_diff,
// _bulk_get, _bulk_docs, open_revs, _local docs. hook, when set, may
// answer a request itself (fault injection).
type fakeCouch struct {
	*httptest.Server
	mu   sync.Mutex
	dbs  map[string]*fakeDB
	hook func(w http.ResponseWriter, r *http.Request) bool
	// changesBodies records the bodies of POST _changes requests.
	changesBodies []string
	changesQuery  []string
	// numeric makes seqs JSON numbers (PouchDB Server, CouchDB 1.x)
	// instead of opaque strings.
	numeric bool
	// startTime is every database's instance_start_time; "" is "0".
	startTime string
}

// instanceStart is the fake's instance_start_time.
func (f *fakeCouch) instanceStart() string {
	if f.startTime == "" {
		return "0"
	}
	return f.startTime
}

// seqOf is seq n as the fake sends it.
func (f *fakeCouch) seqOf(n int) any {
	if f.numeric {
		return n
	}
	return seqStr(n)
}

type fakeDB struct {
	seq   int
	docs  map[string]fakeDoc
	order []string // ids by last update
	local map[string]map[string]any
}

type fakeDoc struct {
	body map[string]any
	rev  string
	seq  int
}

func newFakeCouch(t testing.TB) *fakeCouch {
	f := &fakeCouch{dbs: map[string]*fakeDB{}}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeCouch) addDB(name string) {
	f.dbs[name] = &fakeDB{docs: map[string]fakeDoc{}, local: map[string]map[string]any{}}
}

// put stores body as revision 1-<id-hash> of its _id.
func (f *fakeCouch) put(db string, body map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.dbs[db]
	id := body["_id"].(string)
	rev := fmt.Sprintf("1-%x", len(id)*7919+len(d.docs))
	body["_rev"] = rev
	d.seq++
	d.docs[id] = fakeDoc{body: body, rev: rev, seq: d.seq}
}

func (f *fakeCouch) localDoc(db, id string) map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dbs[db].local[id]
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func seqStr(n int) string { return fmt.Sprintf("%d-fake", n) }

func (f *fakeCouch) serve(w http.ResponseWriter, r *http.Request) {
	if f.hook != nil && f.hook(w, r) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 2)
	name, rest := parts[0], ""
	if len(parts) == 2 {
		rest = parts[1]
	}
	d := f.dbs[name]
	if rest == "" && r.Method == http.MethodPut {
		if d != nil {
			writeJSON(w, 412, map[string]string{"error": "file_exists", "reason": "The database could not be created, the file already exists."})
			return
		}
		f.addDB(name)
		writeJSON(w, 201, map[string]bool{"ok": true})
		return
	}
	if d == nil {
		writeJSON(w, 404, map[string]string{"error": "not_found", "reason": "Database does not exist."})
		return
	}
	body, _ := io.ReadAll(r.Body)
	switch {
	case rest == "":
		writeJSON(w, 200, map[string]any{"db_name": name, "update_seq": f.seqOf(d.seq), "instance_start_time": f.instanceStart(), "doc_count": len(d.docs)})
	case rest == "_ensure_full_commit":
		writeJSON(w, 201, map[string]any{"ok": true, "instance_start_time": f.instanceStart()})
	case strings.HasPrefix(rest, "_local/"):
		id := strings.TrimPrefix(rest, "_local/")
		cur := d.local[id]
		if r.Method == http.MethodGet {
			if cur == nil {
				writeJSON(w, 404, map[string]string{"error": "not_found", "reason": "missing"})
				return
			}
			writeJSON(w, 200, cur)
			return
		}
		var doc map[string]any
		_ = json.Unmarshal(body, &doc)
		if cur != nil && doc["_rev"] != cur["_rev"] {
			writeJSON(w, 409, map[string]string{"error": "conflict", "reason": "Document update conflict."})
			return
		}
		n := 1
		if cur != nil {
			fmt.Sscanf(cur["_rev"].(string), "0-%d", &n)
			n++
		}
		doc["_rev"] = fmt.Sprintf("0-%d", n)
		d.local[id] = doc
		writeJSON(w, 201, map[string]any{"ok": true, "id": "_local/" + id, "rev": doc["_rev"]})
	case rest == "_changes":
		f.changesQuery = append(f.changesQuery, r.URL.RawQuery)
		if r.Method == http.MethodPost {
			f.changesBodies = append(f.changesBodies, string(body))
		}
		var filt struct {
			DocIDs   []string       `json:"doc_ids"`
			Selector map[string]any `json:"selector"`
		}
		_ = json.Unmarshal(body, &filt)
		since := 0
		fmt.Sscanf(r.URL.Query().Get("since"), "%d", &since)
		var ids []string
		for id, doc := range d.docs {
			if doc.seq > since {
				ids = append(ids, id)
			}
		}
		sort.Slice(ids, func(i, j int) bool { return d.docs[ids[i]].seq < d.docs[ids[j]].seq })
		results := []any{}
		for _, id := range ids {
			doc := d.docs[id]
			if r.URL.Query().Get("filter") == "_selector" && !matches(doc.body, filt.Selector) {
				continue
			}
			if r.URL.Query().Get("filter") == "_doc_ids" && !slices.Contains(filt.DocIDs, id) {
				continue
			}
			results = append(results, map[string]any{"seq": f.seqOf(doc.seq), "id": id, "changes": []any{map[string]string{"rev": doc.rev}}})
		}
		lastSeq, pending := f.seqOf(d.seq), 0
		if limit, _ := strconv.Atoi(r.URL.Query().Get("limit")); limit > 0 && len(results) > limit {
			pending = len(results) - limit
			results = results[:limit]
			lastSeq = results[limit-1].(map[string]any)["seq"]
		}
		writeJSON(w, 200, map[string]any{"results": results, "last_seq": lastSeq, "pending": pending})
	case rest == "_revs_diff":
		var q map[string][]string
		_ = json.Unmarshal(body, &q)
		out := map[string]any{}
		for id, revs := range q {
			var missing []string
			for _, rev := range revs {
				if doc, ok := d.docs[id]; !ok || doc.rev != rev {
					missing = append(missing, rev)
				}
			}
			if missing != nil {
				out[id] = map[string]any{"missing": missing}
			}
		}
		writeJSON(w, 200, out)
	case rest == "_bulk_get":
		var q struct {
			Docs []struct{ ID, Rev string } `json:"docs"`
		}
		_ = json.Unmarshal(body, &q)
		var results []any
		for _, x := range q.Docs {
			doc, ok := d.docs[x.ID]
			if !ok || doc.rev != x.Rev {
				results = append(results, map[string]any{"id": x.ID, "docs": []any{map[string]any{"error": map[string]string{"id": x.ID, "rev": x.Rev, "error": "not_found", "reason": "missing"}}}})
				continue
			}
			results = append(results, map[string]any{"id": x.ID, "docs": []any{map[string]any{"ok": withRevisions(doc)}}})
		}
		writeJSON(w, 200, map[string]any{"results": results})
	case rest == "_bulk_docs":
		var q struct {
			Docs []map[string]any `json:"docs"`
		}
		_ = json.Unmarshal(body, &q)
		for _, doc := range q.Docs {
			d.seq++
			delete(doc, "_revisions")
			d.docs[doc["_id"].(string)] = fakeDoc{body: doc, rev: doc["_rev"].(string), seq: d.seq}
		}
		writeJSON(w, 201, []any{})
	default:
		doc, ok := d.docs[rest]
		if !ok {
			writeJSON(w, 404, map[string]string{"error": "not_found", "reason": "missing"})
			return
		}
		if r.URL.Query().Get("open_revs") != "" {
			writeJSON(w, 200, []any{map[string]any{"ok": withRevisions(doc)}})
			return
		}
		writeJSON(w, 200, doc.body)
	}
}

func withRevisions(doc fakeDoc) map[string]any {
	out := map[string]any{}
	for k, v := range doc.body {
		out[k] = v
	}
	_, hash, _ := strings.Cut(doc.rev, "-")
	out["_revisions"] = map[string]any{"start": 1, "ids": []string{hash}}
	return out
}

// matches evaluates a selector of top-level field equalities.
func matches(doc, sel map[string]any) bool {
	for k, v := range sel {
		if fmt.Sprint(doc[k]) != fmt.Sprint(v) {
			return false
		}
	}
	return true
}
