package replicate

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
)

// TestPutPartsStalled: a document whose attachments came as MIME parts
// (open_revs multipart/mixed) is PUT as multipart once; when that stalls,
// it is written as JSON with the attachments' data inline (decoded), and
// the next such document goes as JSON at once.
func TestPutPartsStalled(t *testing.T) {
	var mu sync.Mutex
	var log []string
	var bodies [][]byte
	tgt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			_, _ = io.WriteString(w, `{"db_name":"tgt","instance_start_time":"0","update_seq":"0"}`)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		log = append(log, r.Method+" "+r.URL.Path+" "+strings.SplitN(r.Header.Get("Content-Type"), ";", 2)[0])
		mu.Unlock()
		if strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/") {
			<-r.Context().Done() // held until the client gives up
			return
		}
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer tgt.Close()
	p := fakeParams(t, `,"connection_timeout":500`, tgt.URL+"/src", tgt.URL+"/tgt")
	r := New(p, Options{ServerUUID: "u", Logger: zerolog.Nop(), RetryBackoff: time.Millisecond})
	if err := r.openDBs(); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("hello, gzip"))
	_ = zw.Close()
	doc := func(id string) couch.Doc {
		return couch.Doc{ID: id, Rev: "2-b", HasAttachments: true,
			Body: json.RawMessage(`{"_id":"` + id + `","_rev":"2-b","_revisions":{"start":2,"ids":["b","a"]},"_attachments":{` +
				`"old.txt":{"content_type":"text/plain","revpos":1,"length":3,"digest":"md5-x","stub":true},` +
				`"a.bin":{"content_type":"application/octet-stream","revpos":2,"length":5,"follows":true},` +
				`"z.txt":{"content_type":"text/plain","revpos":2,"length":11,"encoding":"gzip","encoded_length":` + itoa(gz.Len()) + `,"follows":true}}}`),
			Attachments: []couch.Attachment{{Name: "a.bin", ContentType: "application/octet-stream", Data: []byte("bytes")},
				{Name: "z.txt", ContentType: "text/plain", Encoding: "gzip", Data: gz.Bytes()}}}
	}
	w := &worker{r: r}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, id := range []string{"d1", "d2"} {
		if err := w.write(ctx, doc(id)); err != nil {
			t.Fatalf("write %s: %v", id, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"PUT /tgt/d1 multipart/related", "PUT /tgt/d1 application/json", "PUT /tgt/d2 application/json"}
	if strings.Join(log, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(log, "\n"), strings.Join(want, "\n"))
	}
	if w.stats.DocsWritten != 2 {
		t.Errorf("docs_written %d, want 2", w.stats.DocsWritten)
	}
	for _, b := range bodies {
		var got struct {
			Atts map[string]map[string]any `json:"_attachments"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("JSON PUT body: %v", err)
		}
		if a := got.Atts["old.txt"]; a["stub"] != true || a["digest"] != "md5-x" {
			t.Errorf("old.txt %v, want a stub", a)
		}
		for name, data := range map[string]string{"a.bin": "bytes", "z.txt": "hello, gzip"} {
			if a := got.Atts[name]; a["data"] != base64.StdEncoding.EncodeToString([]byte(data)) || a["follows"] != nil || a["encoding"] != nil {
				t.Errorf("%s %v, want its decoded data %q inline", name, a, data)
			}
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
