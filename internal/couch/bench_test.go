package couch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// doc1k is a document of about 1 KiB, like the reference benchmarks'.
func doc1k(i int) string {
	return fmt.Sprintf(`{"_id":"doc-%06d","_rev":"1-%032x","_revisions":{"start":1,"ids":["%032x"]},"pad":"%s"}`, i, i, i, strings.Repeat("x", 900))
}

func benchServer(b *testing.B, body []byte, contentType string) *DB {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", contentType)
		_, _ = w.Write(body)
	}))
	b.Cleanup(srv.Close)
	ep, err := ParseEndpoint(srv.URL + "/db")
	if err != nil {
		b.Fatal(err)
	}
	return NewDB(ep, Options{HTTPClient: srv.Client()})
}

// BenchmarkChangesDecode decodes a 10,000-row style=all_docs feed with
// CouchDB-style string seqs; reported per row.
func BenchmarkChangesDecode(b *testing.B) {
	const rows = 10000
	var buf bytes.Buffer
	buf.WriteString(`{"results":[` + "\n")
	for i := range rows {
		if i > 0 {
			buf.WriteString(",\n")
		}
		fmt.Fprintf(&buf, `{"seq":"%d-g1AAAAFTeJzLYWBg4MhgTmHgz8tPSTV0MDQy1zMAQsMcoARTIkOS_P___7MymBMZcoEC7MlpKSmmZqbYNOCxJ48FSDI0AKn_UFMSGcDaDAyTLAxMk7HpywIA","id":"doc-%06d","changes":[{"rev":"1-%032x"}]}`, i, i, i)
	}
	fmt.Fprintf(&buf, "\n],\n\"last_seq\":\"%d-g1AAAA\",\"pending\":0}\n", rows)
	d := benchServer(b, buf.Bytes(), "application/json")
	b.SetBytes(int64(buf.Len()))
	b.ResetTimer()
	for range b.N {
		n := 0
		if _, err := d.Changes(context.Background(), ChangesOptions{Style: StyleAllDocs}, func(Change) error { n++; return nil }); err != nil || n != rows {
			b.Fatalf("%d rows, %v", n, err)
		}
	}
	b.ReportMetric(float64(b.N*rows)/b.Elapsed().Seconds(), "rows/s")
}

// BulkGetDecode decodes a _bulk_get answer of 500 documents of 1 KiB.
func BenchmarkBulkGetDecode(b *testing.B) {
	const docs = 500
	var buf bytes.Buffer
	buf.WriteString(`{"results":[`)
	reqs := make([]BulkGetRequest, docs)
	for i := range docs {
		if i > 0 {
			buf.WriteByte(',')
		}
		fmt.Fprintf(&buf, `{"id":"doc-%06d","docs":[{"ok":%s}]}`, i, doc1k(i))
		reqs[i] = BulkGetRequest{ID: fmt.Sprintf("doc-%06d", i), Rev: fmt.Sprintf("1-%032x", i)}
	}
	buf.WriteString(`]}`)
	d := benchServer(b, buf.Bytes(), "application/json")
	b.SetBytes(int64(buf.Len()))
	b.ResetTimer()
	for range b.N {
		n := 0
		if err := d.BulkGet(context.Background(), reqs, func(Doc) error { n++; return nil }); err != nil || n != docs {
			b.Fatalf("%d docs, %v", n, err)
		}
	}
	b.ReportMetric(float64(b.N*docs)/b.Elapsed().Seconds(), "docs/s")
}

// BenchmarkBulkDocsSend sends 500 documents of 1 KiB with new_edits=false
// to a server that discards them.
func BenchmarkBulkDocsSend(b *testing.B) {
	const docs = 500
	batch := make([]json.RawMessage, docs)
	size := 0
	for i := range docs {
		batch[i] = json.RawMessage(doc1k(i))
		size += len(batch[i])
	}
	d := benchServer(b, []byte(`[]`), "application/json")
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		if _, err := d.BulkDocs(context.Background(), batch, false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*docs)/b.Elapsed().Seconds(), "docs/s")
}
