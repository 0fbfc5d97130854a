package couch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"sort"
	"strings"
	"testing"
)

func TestBulkGetCouchDBShape(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, 200, `{"results":[
{"id":"a","docs":[{"ok":{"_id":"a","_rev":"2-b","v":1,"_revisions":{"start":2,"ids":["b","a"]}}}]},
{"id":"x","docs":[{"error":{"id":"x","rev":"1-z","error":"not_found","reason":"missing"}}]},
{"id":"d","docs":[{"ok":{"_id":"d","_rev":"3-c","_deleted":true}},{"ok":{"_id":"d","_rev":"3-e","_attachments":{"f":{"content_type":"text/plain","data":"aGk=","revpos":3}}}}]},
{"id":"p","docs":[{"missing":"1-q"},{}]}
]}`)
	})
	reqs := []BulkGetRequest{{ID: "a", Rev: "2-b"}, {ID: "x", Rev: "1-z"}, {ID: "d", Rev: "3-c"}, {ID: "d", Rev: "3-e", AttsSince: []string{"1-a"}}, {ID: "p", Rev: "1-q"}}
	var got []string
	err := f.db(t, Options{}).BulkGet(context.Background(), reqs, func(d Doc) error {
		got = append(got, fmt.Sprintf("%s %s del=%v att=%v", d.ID, d.Rev, d.Deleted, d.HasAttachments))
		if !json.Valid(d.Body) {
			t.Errorf("invalid body %s", d.Body)
		}
		return nil
	})
	want := []string{"a 2-b del=false att=false", "d 3-c del=true att=false", "d 3-e del=false att=true"}
	if err != nil || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("BulkGet = %v, %v; want %v", got, err, want)
	}
	r := f.requests()[0]
	q, _ := url.ParseQuery(r.Query)
	if r.Method != "POST" || r.Path != "/db/_bulk_get" || q.Get("revs") != "true" || q.Get("latest") != "true" || q.Get("attachments") != "false" || q.Get("att_encoding_info") != "true" {
		t.Errorf("request %s %s?%s", r.Method, r.Path, r.Query)
	}
	wantBody := `{"docs":[{"id":"a","rev":"2-b"},{"id":"x","rev":"1-z"},{"id":"d","rev":"3-c"},{"id":"d","rev":"3-e","atts_since":["1-a"]},{"id":"p","rev":"1-q"}]}`
	if string(r.Body) != wantBody {
		t.Errorf("body %s\nwant %s", r.Body, wantBody)
	}
}

func TestBulkGetErrors(t *testing.T) {
	tests := []struct {
		status int
		body   string
		is     error
	}{
		{404, `{"error":"not_found","reason":"missing"}`, ErrBulkGetUnsupported},
		{405, `{"error":"method_not_allowed","reason":"Only GET,HEAD,PUT,DELETE allowed"}`, ErrBulkGetUnsupported},
		{400, `{"error":"bad_request","reason":"Only reserved document ids may start with underscore."}`, ErrBulkGetUnsupported},
		{401, `{"error":"unauthorized","reason":"x"}`, ErrUnauthorized},
		{200, `{"results":[{"id":"a","docs":[{"ok":{"_id":"a"}}]}]}`, ErrBadResponse}, // no _rev
		{200, `{"results":[{"id":"a","docs":[{"ok":`, ErrBadResponse},
		{200, `{"rows":[]}`, ErrBadResponse},
	}
	for _, tt := range tests {
		f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { writeJSON(w, tt.status, tt.body) })
		err := f.db(t, Options{}).BulkGet(context.Background(), []BulkGetRequest{{ID: "a", Rev: "1-a"}}, func(Doc) error { return nil })
		if !errors.Is(err, tt.is) {
			t.Errorf("%d %s: err = %v, want %v", tt.status, tt.body, err, tt.is)
		}
	}
}

// multipartMixed builds CouchDB's open_revs answer: a plain JSON part, a
// multipart/related part with two attachments, and a missing-rev part.
func multipartMixed(t *testing.T) (string, []byte) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	p, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
	_, _ = io.WriteString(p, `{"_id":"a b","_rev":"2-b","v":1,"_revisions":{"start":2,"ids":["b","a"]}}`)

	var inner bytes.Buffer
	rw := multipart.NewWriter(&inner)
	jp, _ := rw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
	_, _ = io.WriteString(jp, `{"_id":"a b","_rev":"2-c","_attachments":{"big.bin":{"content_type":"application/octet-stream","revpos":2,"digest":"md5-x","length":5,"follows":true},"old.txt":{"stub":true,"revpos":1},"z.txt":{"content_type":"text/plain","revpos":2,"encoding":"gzip","encoded_length":3,"follows":true}}}`)
	ap, _ := rw.CreatePart(textproto.MIMEHeader{"Content-Disposition": {`attachment; filename="big.bin"`}, "Content-Type": {"application/octet-stream"}})
	_, _ = ap.Write([]byte{0, 1, 2, 3, 4})
	zp, _ := rw.CreatePart(textproto.MIMEHeader{"Content-Disposition": {`attachment; filename="z.txt"`}, "Content-Type": {"text/plain"}, "Content-Encoding": {"gzip"}})
	_, _ = zp.Write([]byte{9, 9, 9})
	_ = rw.Close()
	rp, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"multipart/related; boundary=\"" + rw.Boundary() + "\""}})
	_, _ = rp.Write(inner.Bytes())

	mp, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {`application/json; error="true"`}})
	_, _ = io.WriteString(mp, `{"missing":"2-zzz"}`)
	_ = mw.Close()
	return "multipart/mixed; boundary=\"" + mw.Boundary() + "\"", buf.Bytes()
}

func TestOpenRevs(t *testing.T) {
	ctMixed, mixed := multipartMixed(t)
	tests := []struct {
		name        string
		contentType string
		body        []byte
		want        []string
		wantAtts    map[string]string // "rev/name" -> "type|encoding|data"
		wantErr     error
	}{
		{
			name: "couchdb multipart/mixed", contentType: ctMixed, body: mixed,
			want:     []string{"a b 2-b att=false", "a b 2-c att=true"},
			wantAtts: map[string]string{"2-c/big.bin": "application/octet-stream||\x00\x01\x02\x03\x04", "2-c/z.txt": "text/plain|gzip|\x09\x09\x09"},
		},
		{
			name: "pouchdb json as text/plain", contentType: "text/plain; charset=utf-8",
			body: []byte(`[{"ok":{"_id":"a b","_rev":"2-b","_attachments":{"f":{"data":"aGk=","content_type":"text/plain"}}}},{"missing":"2-zzz"},{"ok":{"_id":"a b","_rev":"2-c","_deleted":true}}]`),
			want: []string{"a b 2-b att=true", "a b 2-c att=false"},
		},
		{name: "truncated multipart", contentType: ctMixed, body: mixed[:len(mixed)/2], want: []string{"a b 2-b att=false"}, wantErr: ErrBadResponse},
		{name: "bad json", contentType: "application/json", body: []byte(`[{"ok":{]`), wantErr: ErrBadResponse},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", tt.contentType)
				_, _ = w.Write(tt.body)
			})
			var got []string
			atts := map[string]string{}
			err := f.db(t, Options{}).OpenRevs(context.Background(), "a b", []string{"2-b", "2-c", "2-zzz"}, []string{"1-a"}, func(d Doc) error {
				got = append(got, fmt.Sprintf("%s %s att=%v", d.ID, d.Rev, d.HasAttachments))
				for _, a := range d.Attachments {
					atts[d.Rev+"/"+a.Name] = a.ContentType + "|" + a.Encoding + "|" + string(a.Data)
				}
				return nil
			})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("docs = %v, want %v", got, tt.want)
			}
			if tt.wantAtts != nil && fmt.Sprint(atts) != fmt.Sprint(tt.wantAtts) {
				t.Errorf("attachments = %q, want %q", atts, tt.wantAtts)
			}
			r := f.requests()[0]
			q, _ := url.ParseQuery(r.Query)
			if r.RawPath != "/db/a%20b" || q.Get("open_revs") != `["2-b","2-c","2-zzz"]` || q.Get("atts_since") != `["1-a"]` ||
				q.Get("revs") != "true" || q.Get("latest") != "true" || q.Get("attachments") != "true" || r.Header.Get("Accept") != "multipart/mixed" {
				t.Errorf("request %s?%s Accept %q", r.RawPath, r.Query, r.Header.Get("Accept"))
			}
		})
	}
}

func TestOpenRevsSplitsLongURLs(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		q, _ := url.ParseQuery(r.URL.RawQuery)
		var revs []string
		_ = json.Unmarshal([]byte(q.Get("open_revs")), &revs)
		var out []string
		for _, rev := range revs {
			out = append(out, fmt.Sprintf(`{"ok":{"_id":"d","_rev":%q}}`, rev))
		}
		writeJSON(w, 200, "["+strings.Join(out, ",")+"]")
	})
	var revs, since []string
	for i := range 300 {
		revs = append(revs, fmt.Sprintf("%d-%032x", i+2, i))
		since = append(since, fmt.Sprintf("1-%032x", i))
	}
	seen := map[string]bool{}
	err := f.db(t, Options{}).OpenRevs(context.Background(), "d", revs, since, func(d Doc) error {
		seen[d.Rev] = true
		return nil
	})
	if err != nil || len(seen) != len(revs) {
		t.Fatalf("got %d of %d revisions: %v", len(seen), len(revs), err)
	}
	reqs := f.requests()
	if len(reqs) < 2 {
		t.Fatalf("%d requests, want the revisions split", len(reqs))
	}
	for _, r := range reqs {
		if l := len(f.URL) + len(r.RawPath) + 1 + len(r.Query); l > maxURLLen {
			t.Errorf("URL of %d bytes", l)
		}
	}
}

func TestBulkDocs(t *testing.T) {
	docs := []json.RawMessage{
		json.RawMessage(`{"_id":"a","_rev":"1-a","_revisions":{"start":1,"ids":["a"]}}`),
		json.RawMessage(`{"_id":"b","_rev":"1-b"}`),
	}
	tests := []struct {
		name     string
		status   int
		answer   string
		newEdits bool
		want     []DocResult
		wantErr  error
	}{
		{name: "all written", status: 201, answer: `[]`},
		{name: "per-doc errors", status: 201, answer: `[{"id":"b","rev":"1-b","error":"forbidden","reason":"no b"}]`, want: []DocResult{{ID: "b", Rev: "1-b", Error: "forbidden", Reason: "no b"}}},
		{name: "417", status: 417, answer: `[{"id":"a","error":"unauthorized","reason":"x"}]`, want: []DocResult{{ID: "a", Error: "unauthorized", Reason: "x"}}},
		{name: "new edits", status: 201, newEdits: true, answer: `[{"ok":true,"id":"a","rev":"2-x"},{"ok":true,"id":"b","rev":"2-y"}]`, want: []DocResult{{ID: "a", Rev: "2-x"}, {ID: "b", Rev: "2-y"}}},
		{name: "too large", status: 413, answer: `{"error":"too_large","reason":"the request entity is too large"}`, wantErr: ErrTooLarge},
		{name: "garbage", status: 201, answer: `[{"id":`, wantErr: ErrBadResponse},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { writeJSON(w, tt.status, tt.answer) })
			got, err := f.db(t, Options{}).BulkDocs(context.Background(), docs, tt.newEdits)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("BulkDocs = %+v, %v; want %+v", got, err, tt.want)
			}
			r := f.requests()[0]
			var sent struct {
				NewEdits bool              `json:"new_edits"`
				Docs     []json.RawMessage `json:"docs"`
			}
			if err := json.Unmarshal(r.Body, &sent); err != nil || sent.NewEdits != tt.newEdits || len(sent.Docs) != 2 ||
				string(sent.Docs[0]) != string(docs[0]) || r.Header.Get("Content-Type") != "application/json" {
				t.Errorf("sent %s (%v)", r.Body, err)
			}
		})
	}
}

func TestBulkDocsRetryResendsBody(t *testing.T) {
	calls := 0
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		calls++
		if calls == 1 || !json.Valid(body) {
			writeJSON(w, 500, `{"error":"boom"}`)
			return
		}
		writeJSON(w, 201, `[]`)
	})
	if _, err := f.db(t, Options{Retries: 1}).BulkDocs(context.Background(), []json.RawMessage{json.RawMessage(`{"_id":"a","_rev":"1-a"}`)}, false); err != nil {
		t.Fatal(err)
	}
	if reqs := f.requests(); len(reqs) != 2 || !bytes.Equal(reqs[0].Body, reqs[1].Body) {
		t.Fatalf("retry sent a different body: %+v", reqs)
	}
}

func TestPutDoc(t *testing.T) {
	body := json.RawMessage(`{"_id":"a/b","_rev":"2-c","_revisions":{"start":2,"ids":["c","a"]},"_attachments":{"x y.bin":{"content_type":"application/octet-stream","length":3,"follows":true},"z.txt":{"content_type":"text/plain","encoding":"gzip","length":2,"follows":true}}}`)
	tests := []struct {
		name   string
		doc    Doc
		status int
		answer string
		parts  []string // "filename|content-type|encoding|data" after the JSON part
		err    error
	}{
		{name: "json", doc: Doc{ID: "a/b", Rev: "1-a", Body: json.RawMessage(`{"_id":"a/b","_rev":"1-a"}`)}, status: 201, answer: `{"ok":true,"id":"a/b","rev":"1-a"}`},
		{
			name: "multipart", status: 201, answer: `[]`, // PouchDB Server's answer
			doc: Doc{ID: "a/b", Rev: "2-c", Body: body, HasAttachments: true, Attachments: []Attachment{
				{Name: "x y.bin", ContentType: "application/octet-stream", Data: []byte{1, 2, 3}},
				{Name: "z.txt", ContentType: "text/plain", Encoding: "gzip", Data: []byte{7, 8}},
			}},
			parts: []string{"x y.bin|application/octet-stream||\x01\x02\x03", "z.txt|text/plain|gzip|\x07\x08"},
		},
		{name: "forbidden", doc: Doc{ID: "a/b", Body: json.RawMessage(`{}`)}, status: 403, answer: `{"error":"forbidden","reason":"vdu"}`, err: ErrForbidden},
		{name: "missing stub", doc: Doc{ID: "a/b", Body: json.RawMessage(`{}`)}, status: 412, answer: `{"error":"missing_stub","reason":"x"}`, err: ErrMissingStub},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { writeJSON(w, tt.status, tt.answer) })
			err := f.db(t, Options{}).PutDoc(context.Background(), tt.doc)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r := f.requests()[0]
			if r.Method != "PUT" || r.RawPath != "/db/a%2Fb" || r.Query != "new_edits=false" {
				t.Errorf("request %s %s?%s", r.Method, r.RawPath, r.Query)
			}
			mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if tt.parts == nil {
				if mt != "application/json" || string(r.Body) != string(tt.doc.Body) {
					t.Errorf("sent %s %s", mt, r.Body)
				}
				return
			}
			if mt != "multipart/related" {
				t.Fatalf("content type %s", mt)
			}
			mr := multipart.NewReader(bytes.NewReader(r.Body), params["boundary"])
			first, err := mr.NextPart()
			if err != nil {
				t.Fatal(err)
			}
			j, _ := io.ReadAll(first)
			if first.Header.Get("Content-Type") != "application/json" || string(j) != string(tt.doc.Body) {
				t.Errorf("JSON part %q: %s", first.Header, j)
			}
			var got []string
			for {
				p, err := mr.NextPart()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				data, _ := io.ReadAll(p)
				got = append(got, p.FileName()+"|"+p.Header.Get("Content-Type")+"|"+p.Header.Get("Content-Encoding")+"|"+string(data))
			}
			sort.Strings(got)
			if fmt.Sprint(got) != fmt.Sprint(tt.parts) {
				t.Errorf("parts %q, want %q", got, tt.parts)
			}
		})
	}
}

func TestNewDoc(t *testing.T) {
	tests := []struct {
		body string
		want string // "id|rev|deleted|atts" or "error"
	}{
		{`{"_id":"a","_rev":"1-a"}`, "a|1-a|false|false"},
		{` { "x" : {"_id":"no","s":"}\"]"} , "_rev" : "2-b", "_id" : "a\"\u00fc", "_deleted" : true, "n": -1.5e3, "_attachments": {"f":{"stub":true}} } `, "a\"ü|2-b|true|true"},
		{`{"_attachments":{},"_id":"a","_rev":"1-a","l":[1,[2,{"_id":"x"}]],"z":null}`, "a|1-a|false|false"},
		{`{"_id":"a"}`, "error"},
		{`[1]`, "error"},
	}
	for _, tt := range tests {
		d, err := newDoc(json.RawMessage(tt.body))
		got := "error"
		if err == nil {
			got = fmt.Sprintf("%s|%s|%v|%v", d.ID, d.Rev, d.Deleted, d.HasAttachments)
		}
		if got != tt.want {
			t.Errorf("newDoc(%s) = %s (%v), want %s", tt.body, got, err, tt.want)
		}
	}
}
