package couch

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

func md5Digest(b []byte) string {
	s := md5.Sum(b)
	return "md5-" + base64.StdEncoding.EncodeToString(s[:])
}

func TestDocAttachmentStubs(t *testing.T) {
	body := `{"_id":"d","_rev":"3-c","v":{"_attachments":1},"_attachments":{` +
		`"old.txt":{"content_type":"text/plain","revpos":1,"digest":"md5-a","length":5,"stub":true},` +
		`"new.gz":{"content_type":"text/plain","revpos":3,"digest":"md5-b","length":100,"encoding":"gzip","encoded_length":40,"stub":true},` +
		`"mid.bin":{"content_type":"application/octet-stream","revpos":2,"length":0,"stub":true}},` +
		`"_revisions":{"start":3,"ids":["c","b","a"]}}`
	d, err := newDoc([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	stubs, err := d.Stubs()
	if err != nil {
		t.Fatal(err)
	}
	want := []AttachmentStub{
		{Name: "old.txt", ContentType: "text/plain", Digest: "md5-a", Length: 5, RevPos: 1},
		{Name: "new.gz", ContentType: "text/plain", Digest: "md5-b", Length: 100, Encoding: "gzip", EncodedLength: 40, RevPos: 3},
		{Name: "mid.bin", ContentType: "application/octet-stream", RevPos: 2},
	}
	if !reflect.DeepEqual(stubs, want) {
		t.Fatalf("Stubs() = %+v\nwant %+v", stubs, want)
	}
	if got := stubs[1].wireLength(); got != 40 {
		t.Errorf("wireLength of the gzip stub = %d, want its encoded_length 40", got)
	}
	for _, tc := range []struct {
		since []string
		want  int64
	}{
		{nil, 0},
		{[]string{"1-a"}, 1},
		{[]string{"1-a", "2-b"}, 2},
		{[]string{"2-x", "9-z"}, 0}, // not in this revision's history
		{[]string{"3-c"}, 3},
	} {
		if got := d.AncestorPos(tc.since); got != tc.want {
			t.Errorf("AncestorPos(%v) = %d, want %d", tc.since, got, tc.want)
		}
	}
	out, parts, err := d.FollowsBody(stubs, map[string]bool{"new.gz": true, "mid.bin": true})
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 2 || parts[0].Name != "new.gz" || parts[1].Name != "mid.bin" {
		t.Fatalf("parts %+v, want new.gz then mid.bin (the JSON's order)", parts)
	}
	var got struct {
		ID   string                     `json:"_id"`
		V    map[string]int             `json:"v"`
		Atts map[string]map[string]any  `json:"_attachments"`
		Revs map[string]json.RawMessage `json:"_revisions"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("FollowsBody: %v\n%s", err, out)
	}
	if got.ID != "d" || got.V["_attachments"] != 1 || got.Revs == nil {
		t.Errorf("FollowsBody lost members: %s", out)
	}
	if a := got.Atts["old.txt"]; a["stub"] != true || a["follows"] != nil {
		t.Errorf("old.txt = %v, want a stub", a)
	}
	if a := got.Atts["new.gz"]; a["follows"] != true || a["stub"] != nil || a["encoding"] != "gzip" || a["encoded_length"] != float64(40) || a["digest"] != "md5-b" {
		t.Errorf("new.gz = %v, want follows with its encoding", a)
	}

	if s, err := (Doc{ID: "x", HasAttachments: true, Body: []byte(`{"_attachments":{"a":{"stub":true}}}`)}).Stubs(); err != nil || len(s) != 1 || s[0].Sized() {
		t.Errorf("a stub without length: %+v, %v; want one not Sized", s, err)
	}
}

// attachmentSource serves GET /db/d/<name> with the handler's bytes and
// counts the requests.
type attachmentSource struct {
	gets atomic.Int32
}

// target records complete multipart PUTs: each part's headers and bytes.
type putRecord struct {
	json  map[string]any
	parts []string // "name|content-encoding|data"
}

func readPut(t *testing.T, r *http.Request, body []byte) (putRecord, bool) {
	t.Helper()
	if int64(len(body)) != r.ContentLength {
		return putRecord{}, false // cut short: a server discards it
	}
	_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		t.Errorf("content type: %v", err)
		return putRecord{}, false
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	var rec putRecord
	for i := 0; ; i++ {
		p, err := mr.NextPart()
		if err == io.EOF {
			return rec, true
		}
		if err != nil {
			t.Errorf("part %d: %v", i, err)
			return rec, false
		}
		b, _ := io.ReadAll(p)
		if i == 0 {
			if err := json.Unmarshal(b, &rec.json); err != nil {
				t.Errorf("JSON part: %v", err)
			}
			continue
		}
		if cl := p.Header.Get("Content-Length"); cl != strconv.Itoa(len(b)) {
			t.Errorf("part %s: Content-Length %s for %d bytes", p.FileName(), cl, len(b))
		}
		rec.parts = append(rec.parts, p.FileName()+"|"+p.Header.Get("Content-Encoding")+"|"+string(b))
	}
}

func TestPutDocStream(t *testing.T) {
	// Read whole and checked before the request (under 1 MiB), or
	// streamed into it (over).
	for _, size := range []int{4000, 80000} {
		t.Run(strconv.Itoa(size*17>>10)+"KiB", func(t *testing.T) { testPutDocStream(t, []byte(strings.Repeat("attachment bytes ", size))) })
	}
}

func testPutDocStream(t *testing.T, plain []byte) {
	gz := []byte("\x1f\x8b pretend gzip")
	tests := []struct {
		name string
		// serve answers the source's attachment GET (n counts from 1).
		serve     func(w http.ResponseWriter, r *http.Request, n int32)
		putStatus int
		wantErr   error
		wantGets  int32
		wantParts []string // of the one complete PUT; nil: none complete
	}{
		{
			name: "identity and gzip, as stored", wantGets: 2, putStatus: 201,
			serve: func(w http.ResponseWriter, r *http.Request, _ int32) {
				if strings.HasSuffix(r.URL.Path, "/z.gz") {
					if r.Header.Get("Accept-Encoding") != "gzip" {
						t.Errorf("z.gz asked with Accept-Encoding %q", r.Header.Get("Accept-Encoding"))
					}
					w.Header().Set("Content-Encoding", "gzip")
					_, _ = w.Write(gz)
					return
				}
				if r.Header.Get("Accept-Encoding") != "identity" || r.URL.Query().Get("rev") != "2-c" {
					t.Errorf("a b.bin asked with %q, rev %q", r.Header.Get("Accept-Encoding"), r.URL.Query().Get("rev"))
				}
				_, _ = w.Write(plain)
			},
			wantParts: []string{"a b.bin||" + string(plain), "z.gz|gzip|" + string(gz)},
		},
		{
			name: "source sends more", wantErr: ErrAttachmentMismatch, wantGets: 1,
			serve: func(w http.ResponseWriter, r *http.Request, _ int32) {
				w.Header().Set("Transfer-Encoding", "chunked")
				_, _ = w.Write(append(append([]byte{}, plain...), 'x'))
			},
		},
		{
			name: "source sends less", wantErr: ErrAttachmentMismatch, wantGets: 1,
			serve: func(w http.ResponseWriter, r *http.Request, _ int32) {
				w.(http.Flusher).Flush() // chunked: no Content-Length to compare first
				_, _ = w.Write(plain[:100])
			},
		},
		{
			name: "other bytes, same length", wantErr: ErrAttachmentMismatch, wantGets: 1,
			serve: func(w http.ResponseWriter, r *http.Request, _ int32) {
				_, _ = w.Write(bytes.ToUpper(plain))
			},
		},
		{
			name: "identity sent for a gzip stub", wantErr: ErrAttachmentDecoded, wantGets: 2,
			serve: func(w http.ResponseWriter, r *http.Request, _ int32) {
				if strings.HasSuffix(r.URL.Path, "/z.gz") {
					_, _ = w.Write([]byte("decoded text"))
					return
				}
				_, _ = w.Write(plain)
			},
		},
		{
			name: "attachment gone from the source", wantErr: ErrNotFound, wantGets: 1,
			serve: func(w http.ResponseWriter, r *http.Request, _ int32) {
				writeJSON(w, 404, `{"error":"not_found","reason":"missing"}`)
			},
		},
		{
			name: "source connection cut once: the write starts again from the source", putStatus: 201, wantGets: 3,
			serve: func(w http.ResponseWriter, r *http.Request, n int32) {
				if n == 1 {
					w.Header().Set("Content-Length", strconv.Itoa(len(plain)))
					_, _ = w.Write(plain[:1000])
					w.(http.Flusher).Flush()
					conn, _, _ := w.(http.Hijacker).Hijack()
					_ = conn.Close()
					return
				}
				if strings.HasSuffix(r.URL.Path, "/z.gz") {
					w.Header().Set("Content-Encoding", "gzip")
					_, _ = w.Write(gz)
					return
				}
				_, _ = w.Write(plain)
			},
			wantParts: []string{"a b.bin||" + string(plain), "z.gz|gzip|" + string(gz)},
		},
		{
			name: "target refuses the size", putStatus: 413, wantErr: ErrTooLarge, wantGets: 2,
			serve: func(w http.ResponseWriter, r *http.Request, _ int32) {
				if strings.HasSuffix(r.URL.Path, "/z.gz") {
					w.Header().Set("Content-Encoding", "gzip")
					_, _ = w.Write(gz)
					return
				}
				_, _ = w.Write(plain)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var src attachmentSource
			srcFake := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
				tt.serve(w, r, src.gets.Add(1))
			})
			var complete []putRecord
			tgtFake := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if tt.putStatus == 413 {
					writeJSON(w, 413, `{"error":"too_large","reason":"the request entity is too large"}`)
					return
				}
				if rec, ok := readPut(t, r, body); ok {
					complete = append(complete, rec)
				}
				writeJSON(w, http.StatusCreated, `{"ok":true}`)
			})
			doc, err := newDoc([]byte(`{"_id":"d","_rev":"2-c","_revisions":{"start":2,"ids":["c","a"]},"_attachments":{` +
				`"kept":{"content_type":"text/plain","revpos":1,"length":3,"digest":"md5-x","stub":true},` +
				`"a b.bin":{"content_type":"application/octet-stream","revpos":2,"length":` + strconv.Itoa(len(plain)) + `,"digest":"` + md5Digest(plain) + `","stub":true},` +
				`"z.gz":{"content_type":"text/plain","revpos":2,"length":99,"encoding":"gzip","encoded_length":` + strconv.Itoa(len(gz)) + `,"digest":"` + md5Digest(gz) + `","stub":true}}}`))
			if err != nil {
				t.Fatal(err)
			}
			stubs, err := doc.Stubs()
			if err != nil {
				t.Fatal(err)
			}
			body, parts, err := doc.FollowsBody(stubs, map[string]bool{"a b.bin": true, "z.gz": true})
			if err != nil {
				t.Fatal(err)
			}
			source, target := srcFake.db(t, Options{Retries: 3}), tgtFake.db(t, Options{Retries: 3})
			atts := make([]StreamAttachment, len(parts))
			for i, s := range parts {
				atts[i] = StreamAttachment{AttachmentStub: s, Open: func(ctx context.Context) (io.ReadCloser, error) {
					return source.OpenAttachment(ctx, doc.ID, doc.Rev, s)
				}}
			}
			err = target.PutDocStream(context.Background(), doc.ID, body, atts)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Errorf("error shows the password: %v", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if g := src.gets.Load(); g != tt.wantGets {
				t.Errorf("%d GETs of the source, want %d", g, tt.wantGets)
			}
			if tt.wantParts == nil {
				if len(complete) != 0 {
					t.Fatalf("the target got %d complete requests, want none", len(complete))
				}
				return
			}
			if len(complete) != 1 {
				t.Fatalf("the target got %d complete requests, want 1", len(complete))
			}
			if !reflect.DeepEqual(complete[0].parts, tt.wantParts) {
				t.Errorf("parts %q\nwant %q", complete[0].parts, tt.wantParts)
			}
			atts0 := complete[0].json["_attachments"].(map[string]any)
			if k := atts0["kept"].(map[string]any); k["stub"] != true {
				t.Errorf("kept = %v, want a stub", k)
			}
		})
	}
}

// TestPutDocStreamStubsOnly: a document whose attachments are all stubs
// the target has goes as a JSON PUT, never as a multipart/related body
// with only the JSON part (CouchDB 3.4.3 never answers that one).
func TestPutDocStreamStubsOnly(t *testing.T) {
	for _, once := range []bool{false, true} {
		t.Run("once="+strconv.FormatBool(once), func(t *testing.T) {
			var got []string
			tgt := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				got = append(got, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+" "+r.Header.Get("Content-Type"))
				var m map[string]any
				if err := json.Unmarshal(body, &m); err != nil {
					t.Errorf("body is not JSON: %v: %.200s", err, body)
				}
				writeJSON(w, http.StatusCreated, `{"ok":true}`)
			})
			doc, err := newDoc([]byte(`{"_id":"d","_rev":"7-g","_revisions":{"start":7,"ids":["g","f","e","d","c","b","a"]},"_attachments":{` +
				`"att":{"content_type":"application/foobar","revpos":1,"length":6000,"digest":"md5-x","stub":true}}}`))
			if err != nil {
				t.Fatal(err)
			}
			stubs, _ := doc.Stubs()
			body, parts, err := doc.FollowsBody(stubs, nil)
			if err != nil || len(parts) != 0 {
				t.Fatalf("FollowsBody: %d parts, %v", len(parts), err)
			}
			put := tgt.db(t, Options{Retries: 1}).PutDocStream
			if once {
				put = tgt.db(t, Options{Retries: 1}).PutDocStreamOnce
			}
			if err := put(context.Background(), doc.ID, body, nil); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || !strings.HasSuffix(got[0], "new_edits=false application/json") {
				t.Errorf("requests %q, want one PUT ?new_edits=false with Content-Type application/json", got)
			}
		})
	}
}
