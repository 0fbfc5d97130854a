package couch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// decodeDBUpdates reads a continuous _db_updates body as DBUpdates does.
func decodeDBUpdates(body []byte, r func(io.Reader) io.Reader, limit int64) ([]DBUpdate, Seq, error) {
	var rows []DBUpdate
	var last Seq
	js := newLimitedJSONStream(r(bytes.NewReader(body)), limit, "_db_updates row")
	err := readDBUpdates(js, limit, &last, func(u DBUpdate) error { rows = append(rows, u); return nil })
	return rows, last, err
}

func TestReadDBUpdates(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		rows       []DBUpdate
		last       string
		err        string
	}{
		{"rows and heartbeats", "\n{\"db_name\":\"a/b\",\"type\":\"created\",\"seq\":\"1-x\"}\n\n\n{\"db_name\":\"userdb-6a6f65\",\"type\":\"updated\",\"seq\":\"2-y\"}\n{\"last_seq\":\"2-y\"}\n",
			[]DBUpdate{{"a/b", "created", Seq(`"1-x"`)}, {"userdb-6a6f65", "updated", Seq(`"2-y"`)}}, `"2-y"`, ""},
		{"escaped name", `{"db_name":"\u00e9t\u00e9","type":"deleted","seq":3}` + "\n" + `{"last_seq":null}`,
			[]DBUpdate{{"été", "deleted", Seq("3")}}, "3", ""},
		{"error line", `{"db_name":"a","type":"updated","seq":"1-x"}` + "\n" + `{"error":"unknown_error","reason":"x"}`,
			[]DBUpdate{{"a", "updated", Seq(`"1-x"`)}}, `"1-x"`, "feed reported error"},
		{"cut", `{"db_name":"a","type":"updated","seq":"1-x"}` + "\n" + `{"db_name":"b"`,
			[]DBUpdate{{"a", "updated", Seq(`"1-x"`)}}, `"1-x"`, "unexpected EOF"},
		{"ended without last_seq", `{"db_name":"a","type":"updated","seq":"1-x"}` + "\n",
			[]DBUpdate{{"a", "updated", Seq(`"1-x"`)}}, `"1-x"`, "unexpected EOF"},
		{"no db_name", `{"type":"updated","seq":"1-x"}`, nil, "", "without db_name"},
		{"db_name not a string", `{"db_name":1,"type":"updated","seq":"1-x"}`, nil, "", "not a string"},
		{"not an object", `["a"]`, nil, "", "not an object"},
		{"huge", `{"db_name":"` + strings.Repeat("x", 300) + `"}`, nil, "", "more than the limit of 256 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows, last, err := decodeDBUpdates([]byte(tc.body), identity, 256)
			if !reflect.DeepEqual(rows, tc.rows) || string(last) != tc.last {
				t.Fatalf("rows %+v, last %s; want %+v, last %s", rows, last, tc.rows, tc.last)
			}
			if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err %v, want %q", err, tc.err)
			}
		})
	}
}

func TestDBUpdatesRequest(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.URL.RequestURI())
		if r.URL.Query().Get("feed") == "continuous" && r.URL.Query().Get("since") != "" {
			fmt.Fprintln(w, `{"db_name":"x","type":"updated","seq":"6-b"}`)
			fmt.Fprintln(w, `{"last_seq":"6-b"}`)
			return
		}
		if r.URL.Query().Get("since") != "now" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":"unauthorized","reason":"You are not a server admin."}`)
			return
		}
		fmt.Fprintln(w, `{"results":[],"last_seq":"5-a"}`)
	}))
	defer srv.Close()
	ep, err := ParseEndpoint(strings.Replace(srv.URL, "http://", "http://u:s3cret@", 1) + "/prefix/userdb-1/")
	if err != nil {
		t.Fatal(err)
	}
	d := NewDB(ep, Options{})
	seq, err := d.DBUpdatesSeq(context.Background())
	if err != nil || string(seq) != `"5-a"` {
		t.Fatalf("DBUpdatesSeq = %s, %v", seq, err)
	}
	opened := false
	var rows []DBUpdate
	last, err := d.DBUpdates(context.Background(), &DBUpdatesOptions{Since: seq, Heartbeat: 2 * time.Second, Opened: func() { opened = true }},
		func(u DBUpdate) error { rows = append(rows, u); return nil })
	if err != nil || string(last) != `"6-b"` || !opened || len(rows) != 1 || rows[0].DBName != "x" {
		t.Fatalf("DBUpdates: last %s, err %v, opened %v, rows %+v", last, err, opened, rows)
	}
	want := []string{"/prefix/_db_updates?since=now", "/prefix/_db_updates?feed=continuous&heartbeat=2000&since=5-a"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("requests %q, want %q", got, want)
	}
	// The heartbeat stays within a third of connection_timeout.
	got = nil
	short := NewDB(ep, Options{Limits: Limits{ReadTimeout: 3 * time.Second}})
	if _, err := short.DBUpdates(context.Background(), &DBUpdatesOptions{Since: seq}, func(DBUpdate) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if want := "/prefix/_db_updates?feed=continuous&heartbeat=1000&since=5-a"; len(got) != 1 || got[0] != want {
		t.Fatalf("requests %q, want %q", got, want)
	}
	// A refusal is an *HTTPError, without the credentials.
	_, err = d.DBUpdates(context.Background(), &DBUpdatesOptions{}, func(DBUpdate) error { return nil })
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusUnauthorized || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("DBUpdates without since: %v, want a 401 *HTTPError without the password", err)
	}
	// fn's error is returned as is.
	stop := errors.New("stop")
	if _, err := d.DBUpdates(context.Background(), &DBUpdatesOptions{Since: seq}, func(DBUpdate) error { return stop }); err != stop {
		t.Fatalf("DBUpdates with fn failing: %v, want fn's error", err)
	}
}

func FuzzDBUpdatesFeed(f *testing.F) {
	for _, s := range []string{
		"{\"db_name\":\"a/b\",\"type\":\"created\",\"seq\":\"1-x\"}\n\n{\"db_name\":\"c\",\"type\":\"updated\",\"seq\":\"2-g1AAAA\"}\n{\"last_seq\":\"2-g1AAAA\"}\n",
		`{"db_name":"\u00e9","type":"deleted","seq":3}`,
		"\n\n\n",
		`{"error":"unknown_error","reason":"x"}`,
		`{"db_name":"a","type":"updated","seq":"1-x"}{"db_name":"b"`,
		"<html>garbage</html>",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rows, last, err := decodeDBUpdates(body, identity, 1<<10)
		rows1, last1, err1 := decodeDBUpdates(body, iotest.OneByteReader, 1<<10)
		if (err == nil) != (err1 == nil) || !reflect.DeepEqual(rows, rows1) || !last.Equal(last1) {
			t.Fatalf("read at once: %d rows, last %s, err %v; byte by byte: %d rows, last %s, err %v", len(rows), last, err, len(rows1), last1, err1)
		}
		for _, r := range rows {
			if r.DBName == "" {
				t.Fatalf("a row without a name: %+v", r)
			}
			if r.Seq != nil && !json.Valid(r.Seq) {
				t.Fatalf("seq %q is not JSON", r.Seq)
			}
		}
		if last != nil && !json.Valid(last) {
			t.Fatalf("last %q is not JSON", last)
		}
	})
}

// TestDBUpdatesReadDeadline: connection_timeout ends a feed that sends
// nothing, before its headers or after, as a stall.
func TestDBUpdatesReadDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("since") == "after-headers" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	ep, err := ParseEndpoint(srv.URL + "/db")
	if err != nil {
		t.Fatal(err)
	}
	d := NewDB(ep, Options{Limits: Limits{ReadTimeout: 300 * time.Millisecond}})
	for _, since := range []string{"before-headers", "after-headers"} {
		_, err := d.DBUpdates(context.Background(), &DBUpdatesOptions{Since: Seq(`"` + since + `"`)}, func(DBUpdate) error { return nil })
		if !errors.Is(err, ErrFeedStalled) {
			t.Errorf("%s: %v, want ErrFeedStalled", since, err)
		}
	}
}
