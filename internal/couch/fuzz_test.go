package couch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// decodeFeed runs the _changes decoder over body as the answer of a normal
// (or longpoll) or a continuous feed, reading through r(body).
func decodeFeed(body []byte, continuous bool, r func(io.Reader) io.Reader) ([]Change, Seq, error) {
	d := NewDB(Endpoint{}, Options{Limits: Limits{MaxLineBytes: 1 << 16}})
	opts := &ChangesOptions{Feed: FeedNormal}
	if continuous {
		opts.Feed = FeedContinuous
	}
	var rows []Change
	f := &feed{d: d, opts: opts, r: &request{method: "GET", path: "_changes"}, w: &feedWatch{}, ctx: context.Background()}
	f.fn = func(c Change) error {
		c.Rest = false // how the bytes arrived, not what they say
		rows = append(rows, c)
		return nil
	}
	f.js = newLimitedJSONStream(r(bytes.NewReader(body)), d.lim.MaxLineBytes, "_changes row")
	err := f.read()
	return rows, f.lastSeq, err
}

func identity(r io.Reader) io.Reader { return r }

// encodeFeed writes rows (and last) as CouchDB would send them.
func encodeFeed(t *testing.T, rows []Change, last Seq, continuous bool) []byte {
	t.Helper()
	row := func(c Change) []byte {
		m := map[string]any{"seq": c.Seq, "id": c.ID}
		if c.Seq == nil {
			m["seq"] = nil
		}
		ch := make([]map[string]string, len(c.Revs))
		for i, r := range c.Revs {
			ch[i] = map[string]string{"rev": r}
		}
		m["changes"] = ch
		if c.Deleted {
			m["deleted"] = true
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false) // seqs stay byte for byte what the server sent
		if err := enc.Encode(m); err != nil {
			t.Fatalf("encoding row %+v: %v", c, err)
		}
		return bytes.TrimSpace(b.Bytes())
	}
	var b bytes.Buffer
	if continuous {
		for _, c := range rows {
			b.Write(row(c))
			b.WriteString("\n\n") // a heartbeat between rows
		}
		// A continuous feed that ends without last_seq was cut: always end it.
		b.WriteString(`{"last_seq":` + last.String() + "}\n")
		return b.Bytes()
	}
	b.WriteString(`{"results":[`)
	for i, c := range rows {
		if i > 0 {
			b.WriteString(",\n")
		}
		b.Write(row(c))
	}
	b.WriteString("],\n")
	if last != nil {
		b.WriteString(`"last_seq":` + string(last) + ",")
	}
	b.WriteString(`"pending":0}`)
	return b.Bytes()
}

// FuzzChangesFeed: the _changes decoder, on a normal or continuous answer
// of any bytes and any seq shape, never panics; it reads the same rows and
// last seq whether the bytes come at once or one by one; every seq it
// returns is valid JSON; and what it read, written back as a feed of
// either kind, reads back the same.
func FuzzChangesFeed(f *testing.F) {
	for _, s := range []struct {
		body       string
		continuous bool
	}{
		{`{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-x"}]},{"seq":2,"id":"b","changes":[{"rev":"2-y"},{"rev":"2-z"}],"deleted":true}],"last_seq":2,"pending":0}`, false},
		{`{"results":[{"seq":"12-g1AAAAFTeJzLYWBg4MhgTmHgz8tPSTV0MDQy0TMwMLA0MTc2sTQxNDE3NTQ0NQYAJ3ILzw","id":"x","changes":[{"rev":"1-a"}]}],"last_seq":"12-g1AAAAFTeJzLYWBg","pending":3}`, false},
		{`{"results":[{"seq":null,"id":"a","changes":[{"rev":"1-x"}]},{"seq":[3,"abc"],"id":"b","changes":[]}],"last_seq":[3,"abc"]}`, false},
		{"\n{\"results\":[\n\n{\"seq\":1.5e3,\"id\":\"\\u00e9\",\"changes\":[{\"rev\":\"1-x\"}]}\n],\n\"last_seq\":1500}\n", false},
		{"{\"seq\":1,\"id\":\"a\",\"changes\":[{\"rev\":\"1-x\"}]}\n\n{\"seq\":\"2-b\",\"id\":\"b\",\"changes\":[{\"rev\":\"1-y\"}],\"deleted\":true}\n{\"last_seq\":\"2-b\"}\n", true},
		{"{\"seq\":1,\"id\":\"a\",\"changes\":[{\"rev\":\"1-x\"}]}\n{\"error\":\"timeout\",\"reason\":\"gone\"}\n", true},
		{`{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-x"}]}`, false},
		{`{"error":"not_found","reason":"missing"}`, false},
		{"<html>garbage</html>", false},
		{"\n\n\n", true},
	} {
		f.Add([]byte(s.body), s.continuous)
	}
	f.Fuzz(func(t *testing.T, body []byte, continuous bool) {
		rows, last, err := decodeFeed(body, continuous, identity)
		rows1, last1, err1 := decodeFeed(body, continuous, iotest.OneByteReader)
		if (err == nil) != (err1 == nil) || !reflect.DeepEqual(rows, rows1) || !last.Equal(last1) {
			t.Fatalf("read at once: %d rows, last %s, err %v; byte by byte: %d rows, last %s, err %v", len(rows), last, err, len(rows1), last1, err1)
		}
		for _, s := range append([]Seq{last}, seqsOf(rows)...) {
			if s != nil && !json.Valid(s) {
				t.Fatalf("seq %q is not JSON", s)
			}
			_ = s.Param()
			_, _ = s.Int()
		}
		if err != nil {
			if !errors.Is(err, ErrBadResponse) && !errors.Is(err, ErrResponseTooLarge) && !strings.Contains(err.Error(), "feed reported error") {
				t.Fatalf("error %v is neither a malformed response, a size limit nor a feed error", err)
			}
			return
		}
		for _, kind := range []bool{false, true} {
			again := encodeFeed(t, rows, last, kind)
			rows2, last2, err := decodeFeed(again, kind, identity)
			if err != nil {
				t.Fatalf("re-reading %s: %v", again, err)
			}
			if len(rows2) != len(rows) || !last2.Equal(last) {
				t.Fatalf("re-read %d rows, last %s; want %d rows, last %s\n%s", len(rows2), last2, len(rows), last, again)
			}
			for i := range rows {
				a, b := rows[i], rows2[i]
				if a.ID != b.ID || a.Deleted != b.Deleted || !reflect.DeepEqual(a.Revs, b.Revs) || !a.Seq.Equal(b.Seq) {
					t.Fatalf("row %d: %+v re-read as %+v", i, a, b)
				}
			}
		}
	})
}

func seqsOf(rows []Change) []Seq {
	out := make([]Seq, len(rows))
	for i, r := range rows {
		out[i] = r.Seq
	}
	return out
}

// docBytes is what a delivered document holds of the answer.
func docBytes(d Doc) int {
	n := len(d.Body)
	for _, a := range d.Attachments {
		n += len(a.Data)
	}
	return n
}

// checkDocs asserts what every reader of documents guarantees.
func checkDocs(t *testing.T, docs []Doc, bodyLen int) {
	t.Helper()
	sum := 0
	for _, d := range docs {
		if d.ID == "" || d.Rev == "" || !json.Valid(d.Body) {
			t.Fatalf("delivered document without id/rev or with invalid JSON: %+v", d)
		}
		sum += docBytes(d)
	}
	if sum > bodyLen {
		t.Fatalf("documents hold %d bytes of a %d-byte answer", sum, bodyLen)
	}
}

// FuzzOpenRevs: the open_revs reader, on a multipart/mixed answer (JSON
// parts and multipart/related parts with attachments) or a JSON array,
// never panics, delivers only documents with an id, a rev and valid JSON,
// and what it delivers never exceeds the answer.
func FuzzOpenRevs(f *testing.F) {
	related := "--outer\r\nContent-Type: multipart/related; boundary=\"inner\"\r\n\r\n" +
		"--inner\r\nContent-Type: application/json\r\n\r\n" +
		`{"_id":"d","_rev":"2-b","_revisions":{"start":2,"ids":["b","a"]},"_attachments":{"a.txt":{"content_type":"text/plain","revpos":2,"follows":true,"length":5}}}` +
		"\r\n--inner\r\nContent-Disposition: attachment; filename=\"a.txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\n--inner--\r\n" +
		"--outer\r\nContent-Type: application/json; error=\"true\"\r\n\r\n{\"missing\":\"3-c\"}\r\n--outer--"
	for _, s := range []struct {
		ct, body string
	}{
		{`multipart/mixed; boundary="outer"`, related},
		{`multipart/mixed; boundary="outer"`, "--outer\r\nContent-Type: application/json\r\n\r\n{\"_id\":\"d\",\"_rev\":\"1-a\"}\r\n--outer--"},
		{`multipart/mixed; boundary="outer"`, "--outer\r\nContent-Type: application/json\r\n\r\n{\"_id\":\"d\",\"_rev\":\"3-a\",\"_revisions\":{\"start\":5,\"ids\":[\"a\"]}}\r\n--outer--"},
		{`application/json`, `[{"ok":{"_id":"d","_rev":"1-a","x":1}},{"missing":"2-b"}]`},
		{`text/plain`, `[{"ok":{"_id":"d","_rev":"1-a","_attachments":{"a":{"data":"aGk=","content_type":"text/plain"}}}}]`},
	} {
		f.Add(s.ct, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, ct string, body []byte) {
		var docs []Doc
		err := readOpenRevs(ct, bytes.NewReader(body), 1<<16, func(d Doc) error { docs = append(docs, d); return nil })
		checkDocs(t, docs, len(body))
		var ce callerError
		if errors.As(err, &ce) {
			t.Fatalf("callback error reported though the callback never failed: %v", err)
		}
	})
}

// FuzzBulkGet: the _bulk_get reader never panics, delivers only
// documents with an id, a rev, a _revisions matching the rev and valid
// JSON, and never more bytes than the answer.
func FuzzBulkGet(f *testing.F) {
	for _, s := range []string{
		`{"results":[{"id":"a","docs":[{"ok":{"_id":"a","_rev":"1-x","_revisions":{"start":1,"ids":["x"]},"v":1}},{"error":{"id":"a","rev":"2-y","error":"not_found","reason":"missing"}}]},{"id":"b","docs":[{"missing":"1-z"}]}]}`,
		`{"results":[{"id":"a","docs":[{"ok":{"_id":"a","_rev":"2-x","_revisions":{"start":1,"ids":["x"]}}}]}]}`,
		`{"results":[{"id":"a","docs":[{}]}]}`, `{"nope":1}`, `{"results":[`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var docs []Doc
		_ = readBulkGet(newLimitedJSONStream(bytes.NewReader(body), 1<<16, "document"), func(d Doc) error {
			if revs := revisionsOf(d.Body); revs != nil {
				if err := checkRevisions(d.ID, d.Rev, revs); err != nil {
					t.Fatalf("delivered a document whose _revisions does not match: %v", err)
				}
			}
			docs = append(docs, d)
			return nil
		})
		checkDocs(t, docs, len(body))
	})
}

// revisionsOf returns the top-level _revisions of a document, nil when it
// has none.
func revisionsOf(body []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil || m["_revisions"] == nil {
		return nil
	}
	return m["_revisions"]
}
