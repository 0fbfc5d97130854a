package replicate

import (
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// An attachment the source stores gzip'd is asked for in its encoding and
// written encoded, as CouchDB's replicator writes it (the target keeps the
// encoding); a source that answers with the decoded bytes anyway gets its
// document written with identity bytes. CouchDB-shaped fake: PouchDB
// Server stores no encodings.
func TestEncodedAttachments(t *testing.T) {
	text := []byte(strings.Repeat("a compressible line of text\n", 3000))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(text)
	_ = zw.Close()
	sum := md5.Sum(gz.Bytes())
	digest := "md5-" + base64.StdEncoding.EncodeToString(sum[:])

	type put struct {
		stub    map[string]any
		enc     string
		payload []byte
	}
	for _, tc := range []struct {
		name           string
		honoursEncoded bool
		wantStub       map[string]any // members of the target's stub
		wantEnc        string
		wantPayload    []byte
	}{
		{"source sends gzip", true, map[string]any{"encoding": "gzip", "encoded_length": float64(gz.Len()), "length": float64(len(text)), "digest": digest}, "gzip", gz.Bytes()},
		{"source sends identity", false, map[string]any{"encoding": nil, "encoded_length": nil, "length": float64(len(text)), "digest": nil}, "", text},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCouch(t)
			f.addDB("src")
			f.addDB("tgt")
			f.put("src", map[string]any{"_id": "z", "_attachments": map[string]any{"t.txt": map[string]any{
				"content_type": "text/plain", "revpos": 1, "digest": digest, "length": len(text),
				"encoding": "gzip", "encoded_length": gz.Len(), "stub": true,
			}}})
			var mu sync.Mutex
			var puts []put
			f.hook = func(w http.ResponseWriter, r *http.Request) bool {
				switch {
				case r.Method == http.MethodGet && r.URL.Path == "/src/z/t.txt":
					if tc.honoursEncoded && r.Header.Get("Accept-Encoding") == "gzip" {
						w.Header().Set("Content-Encoding", "gzip")
						_, _ = w.Write(gz.Bytes())
					} else {
						_, _ = w.Write(text)
					}
					return true
				case r.Method == http.MethodPut && r.URL.Path == "/tgt/z":
					_, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
					mr := multipart.NewReader(r.Body, params["boundary"])
					var p put
					for i := 0; ; i++ {
						part, err := mr.NextPart()
						if err != nil {
							break
						}
						b, _ := io.ReadAll(part)
						if i == 0 {
							var doc struct {
								Atts map[string]map[string]any `json:"_attachments"`
							}
							_ = json.Unmarshal(b, &doc)
							p.stub = doc.Atts["t.txt"]
							continue
						}
						p.enc, p.payload = part.Header.Get("Content-Encoding"), b
					}
					mu.Lock()
					puts = append(puts, p)
					mu.Unlock()
					writeJSON(w, http.StatusCreated, map[string]any{"ok": true})
					return true
				}
				return false
			}
			res, err := runFake(fakeParams(t, "", f.URL+"/src", f.URL+"/tgt"))
			if err != nil {
				t.Fatal(err)
			}
			if res.Stats.DocsWritten != 1 || res.Stats.DocWriteFailures != 0 {
				t.Errorf("stats %+v", res.Stats)
			}
			if len(puts) != 1 {
				t.Fatalf("%d PUTs of the document, want 1", len(puts))
			}
			p := puts[0]
			for k, want := range tc.wantStub {
				if got := p.stub[k]; got != want {
					t.Errorf("target stub %s = %v, want %v (stub %v)", k, got, want, p.stub)
				}
			}
			if p.stub["follows"] != true || p.enc != tc.wantEnc || !bytes.Equal(p.payload, tc.wantPayload) {
				t.Errorf("part: Content-Encoding %q, %d bytes; want %q, %d bytes", p.enc, len(p.payload), tc.wantEnc, len(tc.wantPayload))
			}
		})
	}
}
