package couch

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"testing"
)

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	out, err := gzipBytes(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func gunzip(t testing.TB, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// bulkDocsOf returns n documents of about size bytes each; random ones do
// not compress.
func bulkDocsOf(n, size int, random bool) []json.RawMessage {
	docs := make([]json.RawMessage, n)
	for i := range docs {
		fill := strings.Repeat("compressible text ", size/18)
		if random {
			b := make([]byte, size*3/4)
			_, _ = rand.Read(b)
			fill = base64.StdEncoding.EncodeToString(b)
		}
		docs[i] = json.RawMessage(fmt.Sprintf(`{"_id":"d%d","_rev":"1-a","s":%q}`, i, fill))
	}
	return docs
}

// TestCompressedRequestBodies: bodies at or over CompressMinBytes go out
// gzip-compressed to a server that takes them; a server that refuses one
// (415 as CouchDB's bad_ctype, 400 as a server that parses the gzip bytes
// as JSON, 500 as PouchDB Server for an encoding it cannot inflate) gets
// it again at once plain, and plain bodies from then on; small and
// incompressible bodies go plain.
func TestCompressedRequestBodies(t *testing.T) {
	tests := []struct {
		name   string
		refuse int // status answered to a compressed body; 0: take it
		docs   []json.RawMessage
		// want: Content-Encoding of each request the server saw, for two
		// BulkDocs calls.
		want []string
	}{
		{"accepted", 0, bulkDocsOf(20, 1000, false), []string{"gzip", "gzip"}},
		{"refused 415", http.StatusUnsupportedMediaType, bulkDocsOf(20, 1000, false), []string{"gzip", "", ""}},
		{"refused 400", http.StatusBadRequest, bulkDocsOf(20, 1000, false), []string{"gzip", "", ""}},
		{"refused 500", http.StatusInternalServerError, bulkDocsOf(20, 1000, false), []string{"gzip", "", ""}},
		{"under the threshold", 0, bulkDocsOf(2, 1000, false), []string{"", ""}},
		{"incompressible", 0, bulkDocsOf(20, 1000, true), []string{"", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if r.Header.Get("Content-Encoding") == "gzip" {
					if tt.refuse != 0 {
						writeJSON(w, tt.refuse, `{"error":"bad_ctype","reason":"refused"}`)
						return
					}
					body = gunzip(t, body)
				}
				var v struct {
					Docs []json.RawMessage `json:"docs"`
				}
				if err := json.Unmarshal(body, &v); err != nil || len(v.Docs) != len(tt.docs) {
					writeJSON(w, 400, `{"error":"bad_request","reason":"invalid_json"}`)
					return
				}
				writeJSON(w, 201, `[]`)
			})
			db := f.db(t, Options{CompressMinBytes: DefaultCompressMinBytes})
			for range 2 {
				if _, err := db.BulkDocs(context.Background(), tt.docs, false); err != nil {
					t.Fatalf("BulkDocs: %v", err)
				}
			}
			var got []string
			for _, r := range f.requests() {
				got = append(got, r.Header.Get("Content-Encoding"))
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("Content-Encoding of the requests %q, want %q", got, tt.want)
			}
		})
	}
}

// TestCompressionOff: without CompressMinBytes every body goes plain.
func TestCompressionOff(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) { writeJSON(w, 200, `{}`) })
	if _, err := f.db(t, Options{}).RevsDiff(context.Background(), map[string][]string{strings.Repeat("x", 20000): {"1-a"}}); err != nil {
		t.Fatal(err)
	}
	if ce := f.requests()[0].Header.Get("Content-Encoding"); ce != "" {
		t.Fatalf("Content-Encoding %q", ce)
	}
}

// gzipServer answers every request with body, gzip-compressed
// (Content-Encoding: gzip) whatever the request's Accept-Encoding, as a
// compressing proxy may.
func gzipServer(t *testing.T, body []byte) *fake {
	z := gz(t, body)
	return newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(200)
		_, _ = w.Write(z)
	})
}

// TestCompressedAnswers: answers sent gzip-compressed are decoded, for a
// body read whole, a _changes feed and a _bulk_get; the limits apply to
// the decoded bytes: a gzip bomb (a few KiB that inflate to MiBs) ends
// with ErrResponseTooLarge at max_response_bytes, max_changes_row_bytes or
// max_document_bytes.
func TestCompressedAnswers(t *testing.T) {
	ctx := context.Background()
	small := Limits{MaxBodyBytes: 64 << 10, MaxLineBytes: 64 << 10, MaxDocumentBytes: 64 << 10}
	bomb := strings.Repeat("0", 8<<20) // 8 MiB of zeros: ~8 KiB compressed
	tests := []struct {
		name    string
		body    string
		call    func(db *DB) error
		tooBig  bool
		checkOK func(t *testing.T, err error)
	}{
		{name: "revs_diff", body: `{"a":{"missing":["1-a"]}}`, call: func(db *DB) error {
			got, err := db.RevsDiff(ctx, map[string][]string{"a": {"1-a"}})
			if err == nil && (len(got["a"].Missing) != 1) {
				err = fmt.Errorf("decoded %+v", got)
			}
			return err
		}},
		{name: "changes", body: `{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-a"}]}],"last_seq":1}`, call: func(db *DB) error {
			got, _, err := collect(t, db, ChangesOptions{})
			if err == nil && (len(got) != 1 || got[0].ID != "a") {
				err = fmt.Errorf("decoded %+v", got)
			}
			return err
		}},
		{name: "bulk_get", body: `{"results":[{"id":"a","docs":[{"ok":{"_id":"a","_rev":"1-a","_revisions":{"start":1,"ids":["a"]}}}]}]}`, call: func(db *DB) error {
			n := 0
			err := db.BulkGet(ctx, []BulkGetRequest{{ID: "a", Rev: "1-a"}}, func(Doc) error { n++; return nil })
			if err == nil && n != 1 {
				err = fmt.Errorf("%d documents decoded", n)
			}
			return err
		}},
		{name: "bomb: body read whole", body: `{"a":{"missing":["` + bomb + `"]}}`, tooBig: true, call: func(db *DB) error {
			_, err := db.RevsDiff(ctx, map[string][]string{"a": {"1-a"}})
			return err
		}},
		{name: "bomb: changes row", body: `{"results":[{"seq":1,"id":"` + bomb + `","changes":[]}],"last_seq":1}`, tooBig: true, call: func(db *DB) error {
			_, _, err := collect(t, db, ChangesOptions{})
			return err
		}},
		{name: "bomb: bulk_get document", body: `{"results":[{"id":"a","docs":[{"ok":{"_id":"a","_rev":"1-a","s":"` + bomb + `"}}]}]}`, tooBig: true, call: func(db *DB) error {
			return db.BulkGet(ctx, []BulkGetRequest{{ID: "a", Rev: "1-a"}}, func(Doc) error { return nil })
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := gzipServer(t, []byte(tt.body))
			err := tt.call(f.db(t, Options{Limits: small}))
			switch {
			case tt.tooBig && !errors.Is(err, ErrResponseTooLarge):
				t.Fatalf("err = %v; want ErrResponseTooLarge", err)
			case !tt.tooBig && err != nil:
				t.Fatalf("err = %v", err)
			}
			if ae := f.requests()[0].Header.Get("Accept-Encoding"); ae != "identity" {
				t.Fatalf("Accept-Encoding %q, want identity (the answer is decoded all the same)", ae)
			}
		})
	}
}

// TestCorruptGzipAnswer: an answer that says gzip and is not is a
// malformed response, not a lost connection.
func TestCorruptGzipAnswer(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Encoding", "gzip")
		writeJSON(w, 200, `{"a":{"missing":["1-a"]}}`)
	})
	_, err := f.db(t, Options{Retries: 3}).RevsDiff(context.Background(), map[string][]string{"a": {"1-a"}})
	if !errors.Is(err, ErrBadResponse) || len(f.requests()) != 1 {
		t.Fatalf("err = %v after %d requests; want ErrBadResponse, not retried", err, len(f.requests()))
	}
}

// BenchmarkGzipBulkDocs is the CPU cost of compressing a _bulk_docs body
// (100 documents of ~1 KB: ids, revisions, numbers and text drawn from a
// 2,000-word vocabulary, seeded) at gzip's fastest level: MB/s of the
// plain body, and the ratio.
func BenchmarkGzipBulkDocs(b *testing.B) {
	rng := mrand.New(mrand.NewPCG(1, 2))
	vocab := make([]string, 2000)
	for i := range vocab {
		w := make([]byte, 3+rng.IntN(8))
		for j := range w {
			w[j] = byte('a' + rng.IntN(26))
		}
		vocab[i] = string(w)
	}
	var plain bytes.Buffer
	plain.WriteString(`{"new_edits":false,"docs":[`)
	for i := range 100 {
		if i > 0 {
			plain.WriteByte(',')
		}
		var text strings.Builder
		for text.Len() < 700 {
			text.WriteString(vocab[rng.IntN(len(vocab))])
			text.WriteByte(' ')
		}
		fmt.Fprintf(&plain, `{"_id":"doc-%06d","_rev":"1-%032x","_revisions":{"start":1,"ids":["%032x"]},"type":"order","customer":"customer-%d","items":[{"sku":"sku-%d","qty":%d,"price":%d.%02d}],"note":%q}`,
			i, rng.Uint64(), rng.Uint64(), rng.IntN(10000), rng.IntN(100000), rng.IntN(9)+1, rng.IntN(1000), rng.IntN(100), text.String())
	}
	plain.WriteString("]}")
	body := plain.Bytes()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var out []byte
	for b.Loop() {
		var err error
		if out, err = gzipBytes(bytes.NewReader(body), int64(len(body))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(body))/float64(len(out)), "ratio")
}
