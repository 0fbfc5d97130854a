package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// reqTrace records, per request a client sends, when it was sent, when
// its response headers came and when its body was read to the end or
// closed (COUCHREP_WAN_TRACE=1 prints it after each couchrep run of
// BenchmarkWAN).
type reqTrace struct {
	next http.RoundTripper
	t0   time.Time

	mu   sync.Mutex
	reqs []*tracedReq
}

type tracedReq struct {
	what, host, kind    string
	start, headers, end time.Duration
	status              int
}

func newReqTrace(next http.RoundTripper) *reqTrace {
	return &reqTrace{next: next, t0: time.Now()}
}

func (rt *reqTrace) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.RawQuery
	if len(q) > 60 {
		q = q[:60] + "…"
	}
	tr := &tracedReq{what: req.Method + " " + req.URL.Path, host: req.URL.Host, kind: replicatorRequestKind(req), start: time.Since(rt.t0)}
	if q != "" {
		tr.what += "?" + q
	}
	rt.mu.Lock()
	rt.reqs = append(rt.reqs, tr)
	rt.mu.Unlock()
	resp, err := rt.next.RoundTrip(req)
	now := time.Since(rt.t0)
	rt.mu.Lock()
	tr.headers = now
	if err != nil {
		tr.end, tr.status = now, -1
	} else {
		tr.status = resp.StatusCode
	}
	rt.mu.Unlock()
	if err == nil {
		resp.Body = &tracedBody{ReadCloser: resp.Body, rt: rt, tr: tr}
	}
	return resp, err
}

type tracedBody struct {
	io.ReadCloser
	rt *reqTrace
	tr *tracedReq
}

func (b *tracedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done()
	}
	return n, err
}

func (b *tracedBody) Close() error {
	b.done()
	return b.ReadCloser.Close()
}

func (b *tracedBody) done() {
	b.rt.mu.Lock()
	if b.tr.end == 0 {
		b.tr.end = time.Since(b.rt.t0)
	}
	b.rt.mu.Unlock()
}

// String lists the requests in the order they were sent, times in ms from
// the trace's start.
func (rt *reqTrace) String() string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	reqs := append([]*tracedReq(nil), rt.reqs...)
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].start < reqs[j].start })
	var sb strings.Builder
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for _, r := range reqs {
		fmt.Fprintf(&sb, "%8.1f %8.1f %8.1f  %3d %s\n", ms(r.start), ms(r.headers), ms(r.end), r.status, r.what)
	}
	return sb.String()
}

// writeTrace appends rt to file under a title.
func writeTrace(b *testing.B, file, title string, rt *reqTrace) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "== %s (sent, headers, end in ms from the start)\n%s\n", title, rt)
}

// replicatorRequestKind names a replicator's request by what it does: "GET db",
// "GET _local", "_changes continuous", "_changes normal", "_bulk_get",
// "_bulk_docs", "_revs_diff", "_ensure_full_commit", "PUT _local", or its
// method and last path segment.
func replicatorRequestKind(req *http.Request) string {
	path := strings.TrimSuffix(req.URL.Path, "/")
	last := path[strings.LastIndex(path, "/")+1:]
	switch {
	case strings.Contains(path, "/_local/"):
		return req.Method + " _local"
	case last == "_changes":
		feed := req.URL.Query().Get("feed")
		if feed == "" {
			feed = "normal"
		}
		return "_changes " + feed
	case strings.HasPrefix(last, "_"):
		return last
	case req.Method == http.MethodGet && strings.Count(path, "/") == 1:
		return "GET db"
	}
	return req.Method + " " + last
}

// rounds is the sequential depth of the requests sent to host: a
// request's round is one more than the latest round among the requests to
// host that had ended before it was sent. It also counts them by kind.
func (rt *reqTrace) rounds(host string) (depth int, kinds map[string]int) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	kinds = map[string]int{}
	round := map[*tracedReq]int{}
	for _, r := range rt.reqs { // in the order sent
		if r.host != host {
			continue
		}
		kinds[r.kind]++
		n := 1
		for p, pr := range round {
			if p.end != 0 && p.end <= r.start && pr+1 > n {
				n = pr + 1
			}
		}
		round[r] = n
		depth = max(depth, n)
	}
	return depth, kinds
}
