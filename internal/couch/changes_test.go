package couch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"
)

func collect(t *testing.T, d *DB, opts ChangesOptions) ([]Change, Seq, error) {
	t.Helper()
	var got []Change
	last, err := d.Changes(context.Background(), opts, func(c Change) error {
		got = append(got, c)
		return nil
	})
	return got, last, err
}

func TestChangesRequests(t *testing.T) {
	tests := []struct {
		name   string
		opts   ChangesOptions
		method string
		query  url.Values
		body   string
	}{
		{name: "defaults", opts: ChangesOptions{}, method: "GET", query: url.Values{}},
		{
			name:   "all parameters",
			opts:   ChangesOptions{Feed: FeedLongpoll, Since: Seq(`"12-g1AAAA"`), Style: StyleAllDocs, Limit: 50, SeqInterval: 10, Heartbeat: 10 * time.Second, Timeout: 30 * time.Second},
			method: "GET",
			query:  url.Values{"feed": {"longpoll"}, "since": {"12-g1AAAA"}, "style": {"all_docs"}, "limit": {"50"}, "seq_interval": {"10"}, "heartbeat": {"10000"}, "timeout": {"30000"}},
		},
		{name: "numeric since", opts: ChangesOptions{Since: Seq(`7`)}, method: "GET", query: url.Values{"since": {"7"}}},
		{name: "doc_ids", opts: ChangesOptions{DocIDs: []string{"a", "b/c"}}, method: "POST", query: url.Values{"filter": {"_doc_ids"}}, body: `{"doc_ids":["a","b/c"]}`},
		{name: "selector", opts: ChangesOptions{Selector: json.RawMessage(`{"type":"x"}`)}, method: "POST", query: url.Values{"filter": {"_selector"}}, body: `{"selector":{"type":"x"}}`},
		{name: "named filter", opts: ChangesOptions{Filter: "app/by_type", QueryParams: map[string]string{"type": "a b", "n": "1"}}, method: "GET", query: url.Values{"filter": {"app/by_type"}, "type": {"a b"}, "n": {"1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
				writeJSON(w, 200, `{"results":[],"last_seq":"0-x","pending":0}`)
			})
			_, last, err := collect(t, f.db(t, Options{}), tt.opts)
			if err != nil || !last.Equal(Seq(`"0-x"`)) {
				t.Fatalf("Changes = %s, %v", last, err)
			}
			r := f.requests()[0]
			q, _ := url.ParseQuery(r.Query)
			if r.Method != tt.method || r.Path != "/db/_changes" || !reflect.DeepEqual(q, tt.query) {
				t.Errorf("request %s %s?%s, want %s with %v", r.Method, r.Path, r.Query, tt.method, tt.query)
			}
			if string(r.Body) != tt.body {
				t.Errorf("body %s, want %s", r.Body, tt.body)
			}
		})
	}
	if _, _, err := collect(t, NewDB(Endpoint{}, Options{}), ChangesOptions{DocIDs: []string{"a"}, Filter: "a/b"}); err == nil {
		t.Error("doc_ids with filter accepted")
	}
}

func TestChangesFeeds(t *testing.T) {
	tests := []struct {
		name    string
		opts    ChangesOptions
		body    string
		want    []Change
		last    Seq
		wantErr error
	}{
		{
			name: "couchdb normal, string seqs, all_docs",
			body: `{"results":[
{"seq":"1-g1AAAAaa","id":"a","changes":[{"rev":"2-b"},{"rev":"2-c"}]},
{"seq":"2-g1AAAAbb","id":"d","changes":[{"rev":"3-x"}],"deleted":true}
],
"last_seq":"2-g1AAAAbb","pending":0}`,
			want: []Change{{Seq: Seq(`"1-g1AAAAaa"`), ID: "a", Revs: []string{"2-b", "2-c"}}, {Seq: Seq(`"2-g1AAAAbb"`), ID: "d", Revs: []string{"3-x"}, Deleted: true}},
			last: Seq(`"2-g1AAAAbb"`),
		},
		{
			name: "longpoll with heartbeats inside the body",
			opts: ChangesOptions{Feed: FeedLongpoll},
			body: "{\"results\":[\n\n\n{\"seq\":5,\"id\":\"a\",\"changes\":[{\"rev\":\"1-a\"}]}\n],\n\"last_seq\":5}\n",
			want: []Change{{Seq: Seq(`5`), ID: "a", Revs: []string{"1-a"}}},
			last: Seq(`5`),
		},
		{
			name: "seq_interval nulls",
			body: `{"results":[{"seq":null,"id":"a","changes":[{"rev":"1-a"}]},{"seq":"2-z","id":"b","changes":[{"rev":"1-b"}]}],"last_seq":"2-z"}`,
			want: []Change{{ID: "a", Revs: []string{"1-a"}}, {Seq: Seq(`"2-z"`), ID: "b", Revs: []string{"1-b"}}},
			last: Seq(`"2-z"`),
		},
		{
			name: "continuous with heartbeats and last_seq",
			opts: ChangesOptions{Feed: FeedContinuous},
			body: "{\"seq\":\"1-a\",\"id\":\"x\",\"changes\":[{\"rev\":\"1-x\"}]}\n\n\n{\"seq\":\"2-b\",\"id\":\"y\",\"changes\":[{\"rev\":\"1-y\"}]}\n\n{\"last_seq\":\"2-b\",\"pending\":0}\n",
			want: []Change{{Seq: Seq(`"1-a"`), ID: "x", Revs: []string{"1-x"}}, {Seq: Seq(`"2-b"`), ID: "y", Revs: []string{"1-y"}}},
			last: Seq(`"2-b"`),
		},
		{
			name:    "continuous cut mid-line",
			opts:    ChangesOptions{Feed: FeedContinuous, Since: Seq(`"0-s"`)},
			body:    "{\"seq\":\"1-a\",\"id\":\"x\",\"changes\":[{\"rev\":\"1-x\"}]}\n{\"seq\":\"2-b\",\"id\":\"y\",\"chan",
			want:    []Change{{Seq: Seq(`"1-a"`), ID: "x", Revs: []string{"1-x"}}},
			last:    Seq(`"1-a"`),
			wantErr: ErrBadResponse,
		},
		{
			name:    "normal cut mid-results",
			body:    `{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-a"}]},`,
			want:    []Change{{Seq: Seq(`1`), ID: "a", Revs: []string{"1-a"}}},
			last:    Seq(`1`),
			wantErr: ErrBadResponse,
		},
		{name: "malformed JSON", body: `{"results":[{"seq":1,"id":}]}`, wantErr: ErrBadResponse},
		{name: "not an object", body: `[]`, wantErr: ErrBadResponse},
		{name: "html error page", body: `<html>oops</html>`, wantErr: ErrBadResponse},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, tt.body)
			})
			got, last, err := collect(t, f.db(t, Options{}), tt.opts)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), "/db/_changes") {
					t.Fatalf("err = %v, want %v naming the URL", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("changes = %+v, want %+v", got, tt.want)
			}
			if !last.Equal(tt.last) {
				t.Errorf("last seq = %s, want %s", last, tt.last)
			}
		})
	}
}

func TestChangesCallbackErrorStops(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		writeJSON(w, 200, `{"results":[{"seq":1,"id":"a","changes":[]},{"seq":2,"id":"b","changes":[]}],"last_seq":2}`)
	})
	stop := errors.New("stop")
	n := 0
	last, err := f.db(t, Options{}).Changes(context.Background(), ChangesOptions{}, func(Change) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 || !last.Equal(Seq(`1`)) {
		t.Fatalf("Changes = %s, %v after %d rows", last, err, n)
	}
}

func TestChangesDocIDsFallback(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		if r.Method == http.MethodPost {
			writeJSON(w, 405, `{"error":"method_not_allowed","reason":"Only GET,HEAD allowed"}`)
			return
		}
		writeJSON(w, 200, `{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-a"}]},{"seq":2,"id":"b","changes":[{"rev":"1-b"}]},{"seq":3,"id":"c","changes":[{"rev":"1-c"}]}],"last_seq":3}`)
	})
	got, last, err := collect(t, f.db(t, Options{}), ChangesOptions{DocIDs: []string{"b"}})
	if err != nil || len(got) != 1 || got[0].ID != "b" || !last.Equal(Seq(`3`)) {
		t.Fatalf("Changes = %+v, %s, %v", got, last, err)
	}
	if reqs := f.requests(); len(reqs) != 2 || reqs[1].Method != "GET" || strings.Contains(reqs[1].Query, "filter") {
		t.Fatalf("requests %+v", reqs)
	}
}

// hangingFeed writes head and then holds the response open until the
// client goes away, as pouchdb-server does with longpoll and continuous.
func hangingFeed(t *testing.T, head string, heartbeat time.Duration) *fake {
	return newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, head)
		w.(http.Flusher).Flush()
		if heartbeat <= 0 {
			<-r.Context().Done()
			return
		}
		tick := time.NewTicker(heartbeat)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
				_, _ = io.WriteString(w, "\n")
				w.(http.Flusher).Flush()
			}
		}
	})
}

func TestChangesServerIgnoresTimeout(t *testing.T) {
	defer func(g time.Duration) { idleGrace = g }(idleGrace)
	idleGrace = 10 * time.Millisecond
	tests := []struct {
		name string
		opts ChangesOptions
		head string
		want int
		last Seq
	}{
		{name: "longpoll without changes", opts: ChangesOptions{Feed: FeedLongpoll, Since: Seq(`4`), Timeout: 20 * time.Millisecond}, head: `{"results":[` + "\n", last: Seq(`4`)},
		{name: "continuous never sends last_seq", opts: ChangesOptions{Feed: FeedContinuous, Timeout: 20 * time.Millisecond, Heartbeat: 5 * time.Millisecond},
			head: `{"seq":7,"id":"a","changes":[{"rev":"1-a"}]}` + "\n", want: 1, last: Seq(`7`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := hangingFeed(t, tt.head, tt.opts.Heartbeat)
			got, last, err := collect(t, f.db(t, Options{}), tt.opts)
			if err != nil || len(got) != tt.want || !last.Equal(tt.last) {
				t.Fatalf("Changes = %+v, %s, %v", got, last, err)
			}
		})
	}
}

func TestChangesStall(t *testing.T) {
	defer func(g time.Duration) { stallGrace = g }(stallGrace)
	stallGrace = 10 * time.Millisecond
	f := hangingFeed(t, `{"seq":"3-c","id":"a","changes":[{"rev":"1-a"}]}`+"\n", 0) // asked for heartbeats, sends none
	got, last, err := collect(t, f.db(t, Options{}), ChangesOptions{Feed: FeedContinuous, Heartbeat: time.Millisecond})
	if !errors.Is(err, ErrFeedStalled) || len(got) != 1 || !last.Equal(Seq(`"3-c"`)) {
		t.Fatalf("Changes = %+v, %s, %v; want ErrFeedStalled after one row", got, last, err)
	}
}

// TestChangesQuietFeed: a continuous feed whose heartbeats stop (a proxy
// dropping them, the connection kept) ends after the DB's read deadline
// (connection_timeout) with ErrFeedStalled, not after 2×heartbeat+5 s; a
// feed whose heartbeats come keeps going past it.
func TestChangesQuietFeed(t *testing.T) {
	const readTimeout = 300 * time.Millisecond
	head := `{"seq":"3-c","id":"a","changes":[{"rev":"1-a"}]}` + "\n"
	tests := []struct {
		name      string
		heartbeat time.Duration // the server's; 0: none
		wantStall bool
	}{
		{"heartbeats dropped", 0, true},
		{"heartbeats arrive", 20 * time.Millisecond, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := hangingFeed(t, head, tt.heartbeat)
			db := f.db(t, Options{Limits: Limits{ReadTimeout: readTimeout}})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := db.Changes(ctx, ChangesOptions{Feed: FeedContinuous, Heartbeat: time.Hour}, func(Change) error { return nil })
				done <- err
			}()
			if tt.wantStall {
				err := <-done
				if !errors.Is(err, ErrFeedStalled) || !errors.Is(err, ErrStalled) || !strings.Contains(err.Error(), "connection_timeout") {
					t.Fatalf("err = %v; want ErrFeedStalled (connection_timeout)", err)
				}
				return
			}
			select {
			case err := <-done:
				t.Fatalf("a feed with heartbeats ended: %v", err)
			case <-time.After(4 * readTimeout): // the feed must outlive several windows
			}
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v; want context.Canceled", err)
			}
		})
	}
}

func TestChangesContextCancel(t *testing.T) {
	f := hangingFeed(t, `{"seq":1,"id":"a","changes":[{"rev":"1-a"}]}`+"\n", 0)
	ctx, cancel := context.WithCancel(context.Background())
	last, err := f.db(t, Options{}).Changes(ctx, ChangesOptions{Feed: FeedContinuous}, func(Change) error {
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || !last.Equal(Seq(`1`)) {
		t.Fatalf("Changes = %s, %v; want context.Canceled", last, err)
	}
}

// TestChangesRest: in a continuous feed, the row after which nothing more
// had arrived is marked Rest (a batcher cuts its batch there); rows of a
// normal feed never are.
func TestChangesRest(t *testing.T) {
	two := `{"seq":1,"id":"a","changes":[{"rev":"1-a"}]}` + "\n" + `{"seq":2,"id":"b","changes":[{"rev":"1-b"}]}` + "\n"
	f := hangingFeed(t, two, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var rest []bool
	_, _ = f.db(t, Options{}).Changes(ctx, ChangesOptions{Feed: FeedContinuous}, func(c Change) error {
		rest = append(rest, c.Rest)
		if len(rest) == 2 {
			cancel()
		}
		return nil
	})
	if fmt.Sprint(rest) != "[false true]" {
		t.Fatalf("Rest of the rows %v, want [false true]", rest)
	}
	n := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		writeJSON(w, 200, `{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-a"}]}],"last_seq":1}`)
	})
	got, _, err := collect(t, n.db(t, Options{}), ChangesOptions{})
	if err != nil || len(got) != 1 || got[0].Rest {
		t.Fatalf("normal feed: %+v, %v", got, err)
	}
}
