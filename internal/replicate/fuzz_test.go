package replicate

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// knownFields are the fields a *ParamError may name ("" is the document
// as a whole).
var knownFields = map[string]bool{
	"": true, "source": true, "target": true, "continuous": true, "create_target": true,
	"create_target_params": true, "doc_ids": true, "filter": true, "query_params": true,
	"selector": true, "since_seq": true, "use_checkpoints": true, "checkpoint_interval": true,
	"worker_processes": true, "worker_batch_size": true, "http_connections": true,
	"connection_timeout": true, "retries_per_request": true, "use_bulk_get": true,
	"winning_revs_only": true, "user_ctx": true, "proxy": true, "source_proxy": true,
	"target_proxy": true, "cancel": true, "replication_id": true, "id": true, "_local_id": true,
}

// renderParams writes p back as a replication document: what a parsed
// document means, in a form ParseParams reads to the same Params.
func renderParams(t *testing.T, p Params) []byte {
	t.Helper()
	ep := func(e EndpointParams) any {
		m := map[string]any{"url": e.URL}
		if len(e.Headers) > 0 {
			h := map[string]string{}
			for _, x := range e.Headers {
				h[x.Name] = x.Value
			}
			m["headers"] = h
		}
		if e.HasBasic {
			m["auth"] = map[string]any{"basic": map[string]string{"username": e.BasicUser, "password": e.BasicPass}}
		}
		return m
	}
	doc := map[string]any{
		"source": ep(p.Source), "target": ep(p.Target),
		"continuous": p.Continuous, "create_target": p.CreateTarget,
		"use_checkpoints": p.UseCheckpoints, "use_bulk_get": p.UseBulkGet, "winning_revs_only": p.WinningRevsOnly,
		"checkpoint_interval": p.CheckpointInterval.Milliseconds(), "connection_timeout": p.ConnectionTimeout.Milliseconds(),
		"worker_processes": p.WorkerProcesses, "worker_batch_size": p.WorkerBatchSize,
		"http_connections": p.HTTPConnections, "retries_per_request": p.RetriesPerRequest,
	}
	raw := map[string]json.RawMessage{"create_target_params": p.CreateTargetParams, "query_params": p.QueryParams,
		"selector": p.Selector, "since_seq": p.SinceSeq}
	for k, v := range raw {
		if v != nil {
			doc[k] = v
		}
	}
	if p.DocIDs != nil {
		ids := make([]string, len(p.DocIDs))
		for i, id := range p.DocIDs {
			ids[i] = url.QueryEscape(id) // ParseParams unescapes them again
		}
		doc["doc_ids"] = ids
	}
	if p.Filter != "" {
		doc["filter"] = p.Filter
	}
	if p.Source.Proxy != "" {
		doc["source_proxy"] = p.Source.Proxy
	}
	if p.Target.Proxy != "" {
		doc["target_proxy"] = p.Target.Proxy
	}
	if p.UserCtx != nil {
		doc["user_ctx"] = p.UserCtx
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // raw values stay byte for byte what the user sent
	if err := enc.Encode(doc); err != nil {
		t.Fatalf("rendering %+v: %v", p, err)
	}
	return bytes.TrimSpace(buf.Bytes())
}

// FuzzParseReplicateRequest: any body gives either a request whose
// replication id can be computed, or a *ParamError naming a known field
// with a reason; a valid replication written back as JSON parses to the
// same Params and the same replication id.
func FuzzParseReplicateRequest(f *testing.F) {
	for _, s := range []string{
		`{"source":"http://a/db","target":"http://b/db"}`,
		`{"source":{"url":"https://u:p@a:5984/db?x=1","headers":{"X-A":"1","Authorization":"Basic dTpw"},"auth":{"basic":{"username":"u","password":"p"}}},"target":"http://b/db","continuous":true,"create_target":true}`,
		`{"source":"http://a/db","target":"http://b/db","doc_ids":["a%2Fb","c+d","a%2Fb"],"since_seq":"12-abc"}`,
		`{"source":"http://a/db","target":"http://b/db","selector":{"x":{"$gt":1},"$or":[{"a":1},{"b":{"$not":{"$eq":2}}}]}}`,
		`{"source":"http://a/db","target":"http://b/db","filter":"d/f","query_params":{"i":2,"s":"x"}}`,
		`{"source":"http://a/db","target":"http://b/db","filter":"_view","query_params":{"view":"d/v"}}`,
		`{"source":"http://a/db","target":"http://b/db","proxy":"socks5://p:1080","worker_processes":"8","connection_timeout":1000,"user_ctx":{"name":"bob","roles":["_admin"]}}`,
		`{"replication_id":"abc continuous","cancel":true}`,
		`{"source":"http://a/db","target":"http://b/db","worker_processes":99999999999999999999}`,
		`{"source":"db","target":"ftp://x/y"}`, `[]`, `{"source":1}`, `{"source":"http://a/db","target":"http://b/db","since_seq":1e400}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseReplicateRequest(body)
		if err != nil {
			var pe *ParamError
			if !errors.As(err, &pe) || !errors.Is(err, ErrInvalidParams) {
				t.Fatalf("error %v (%T) is not a *ParamError", err, err)
			}
			if !knownFields[pe.Field] || pe.Reason == "" || (pe.Code != CodeBadRequest && pe.Code != CodeInvalidReplication) {
				t.Fatalf("ParamError %+v: unknown field, empty reason or unknown code", pe)
			}
			if strings.Contains(pe.Reason, "\x00") {
				t.Fatalf("reason with NUL: %q", pe.Reason)
			}
			return
		}
		if !req.HasEndpoints {
			if req.ID == "" || !req.Cancel {
				t.Fatalf("no endpoints but not a cancel by id: %+v", req)
			}
			return
		}
		p := req.Params
		if p.Source.URL == "" || p.Target.URL == "" || p.WorkerProcesses < 1 || p.WorkerBatchSize < 1 ||
			p.HTTPConnections < 1 || p.RetriesPerRequest < 0 || p.ConnectionTimeout < time.Millisecond || p.CheckpointInterval < time.Millisecond {
			t.Fatalf("valid request with invalid params: %+v", p)
		}
		for _, u := range []string{p.Source.URL, p.Target.URL} {
			if _, err := couch.ParseEndpoint(u); err != nil {
				t.Fatalf("valid request whose endpoint %q the client rejects: %v", u, err)
			}
		}
		if p.Filter != "" && !strings.HasPrefix(p.Filter, "_") {
			p = p.WithFilterCode("function(doc, req) { return true; }")
		}
		base, ext, err := ID(p, "fuzz-uuid")
		if err != nil {
			t.Fatalf("valid request %s has no replication id: %v", body, err)
		}
		again := renderParams(t, p)
		p2, err := ParseParams(again)
		if err != nil {
			t.Fatalf("re-parsing %s: %v", again, err)
		}
		if p.filterCodeSet {
			p2 = p2.WithFilterCode(p.FilterCode)
		}
		if !reflect.DeepEqual(p, p2) {
			t.Fatalf("params changed on re-parse:\n%+v\n%+v\nfrom %s", p, p2, again)
		}
		base2, ext2, err := ID(p2, "fuzz-uuid")
		if err != nil || base2 != base || ext2 != ext {
			t.Fatalf("replication id %s%s, re-parsed %s%s (%v)", base, ext, base2, ext2, err)
		}
	})
}

// FuzzCheckpointReader: a checkpoint document from an endpoint either
// fails to parse, or parses to a checkpoint that survives writing and
// reading back, agrees with itself at its own last seq, and never makes
// compareCheckpoints panic or invent a seq.
func FuzzCheckpointReader(f *testing.F) {
	for _, s := range []string{
		`{"_id":"_local/x","_rev":"0-3","session_id":"s1","source_last_seq":12,"replication_id_version":4,"history":[{"session_id":"s1","start_time":"Sat, 21 Nov 2026 10:35:55 GMT","end_time":"Sat, 21 Nov 2026 10:35:56 GMT","start_last_seq":0,"end_last_seq":12,"recorded_seq":12,"missing_checked":3,"missing_found":3,"docs_read":3,"docs_written":3,"doc_write_failures":0}]}`,
		`{"session_id":"s2","source_last_seq":"34-g1AAAAB","history":[{"session_id":"s2","recorded_seq":"34-g1AAAAB"},{"session_id":"s1","recorded_seq":[1,"x"]}]}`,
		`{"session_id":"s3","source_last_seq":null,"history":[]}`,
		`{"history":"nope"}`, `[]`, `null`, `{"docs_read":-1,"start_time":"x","doc_write_failures":1e3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := parseStoredCheckpoint(raw)
		if err != nil {
			return
		}
		b, err := json.Marshal(c.Checkpoint)
		if err != nil {
			t.Fatalf("a parsed checkpoint does not encode: %v", err)
		}
		c2, err := parseStoredCheckpoint(b)
		if err != nil {
			t.Fatalf("re-reading %s: %v", b, err)
		}
		if b2, _ := json.Marshal(c2.Checkpoint); !bytes.Equal(b, b2) {
			t.Fatalf("checkpoint changed on a round trip:\n%s\n%s", b, b2)
		}
		seq, hist := compareCheckpoints(c.Checkpoint, c.Checkpoint)
		if !seq.Equal(c.SourceLastSeq) || len(hist) != len(c.History) {
			t.Fatalf("a checkpoint compared with itself gives seq %s (want %s), %d history entries (want %d)", seq, c.SourceLastSeq, len(hist), len(c.History))
		}
		// Against an empty target: agreement only through a shared session.
		seq, _ = compareCheckpoints(c.Checkpoint, Checkpoint{SessionID: "other"})
		if !seq.IsZero() {
			t.Fatalf("no shared session but seq %s", seq)
		}
		next := newCheckpoint("new", nil, c.SourceLastSeq, time.Unix(0, 0), time.Unix(1, 0), Stats{}, c.History, false)
		if len(next.History) > maxHistory || next.History[0].SessionID != "new" {
			t.Fatalf("the next checkpoint keeps %d entries, first %q", len(next.History), next.History[0].SessionID)
		}
	})
}
