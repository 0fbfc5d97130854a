package integration

import (
	"encoding/json"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"sync"
	"testing"
	"time"
)

// inflightProxy is a reverse proxy in this process in front of a server
// the tests did not start (an Apache CouchDB): the node is given its URL,
// so every request the node sends that server goes through it and is
// counted as count-requests.js counts a PouchDB Server's, from arrival
// until the response is written: requests in flight (feeds apart) and
// their peak, feeds open and their peak, and the total. It answers GET
// /_couchrep_requests itself (?reset=1 starts new peaks), so
// perUser.requests reads it as it reads the test server.
type inflightProxy struct {
	URL string // "http://127.0.0.1:<port>/"
	mu  sync.Mutex
	c   serverRequests
	srv *http.Server
}

var feedQuery = regexp.MustCompile(`(^|&)feed=(continuous|longpoll|eventsource)`)

// startInflightProxy starts a counting proxy to target (a server root URL;
// its userinfo is not used: the node sends its own credentials), stopped
// when t ends.
func startInflightProxy(t testing.TB, target string) *inflightProxy {
	t.Helper()
	to, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	to.User = nil
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &inflightProxy{URL: "http://" + ln.Addr().String() + "/"}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(to)
			r.Out.Header["X-Forwarded-For"] = nil // as a direct client
		},
		FlushInterval: -1, // feeds stream
		// A failed exchange with the server is counted (the node sees a
		// 502 and retries as it would a reset connection); the first few
		// are logged, by method and path.
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.mu.Lock()
			p.c.Errors++
			n := p.c.Errors
			p.mu.Unlock()
			if n <= 5 {
				log.Printf("counting proxy: %s %s: %v", r.Method, r.URL.Path, err)
			}
			w.WriteHeader(http.StatusBadGateway)
		},
		Transport: &http.Transport{
			Proxy:               nil,
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 4096,
			IdleConnTimeout:     90 * time.Second,
		},
	}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/_couchrep_requests" {
			p.mu.Lock()
			c := p.c
			if r.URL.Query().Get("reset") == "1" {
				p.c.Peak, p.c.PeakFeeds = p.c.Inflight, p.c.Feeds
			}
			p.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(c)
			return
		}
		feed := feedQuery.MatchString(r.URL.RawQuery)
		p.mu.Lock()
		p.c.Total++
		if feed {
			p.c.Feeds++
			p.c.PeakFeeds = max(p.c.PeakFeeds, p.c.Feeds)
		} else {
			p.c.Inflight++
			p.c.Peak = max(p.c.Peak, p.c.Inflight)
		}
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			if feed {
				p.c.Feeds--
			} else {
				p.c.Inflight--
			}
			p.mu.Unlock()
		}()
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() { _ = p.srv.Close() })
	return p
}

// counts returns the proxy's counts; reset starts new peaks.
func (p *inflightProxy) counts(reset bool) serverRequests {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.c
	if reset {
		p.c.Peak, p.c.PeakFeeds = p.c.Inflight, p.c.Feeds
	}
	return c
}

// via is u (a URL on the proxied server, with credentials) as the node
// reaches it through the proxy: the proxy's host, u's userinfo and path.
func (p *inflightProxy) via(t testing.TB, u string) string {
	t.Helper()
	in, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := url.Parse(p.URL)
	in.Scheme, in.Host = out.Scheme, out.Host
	return in.String()
}

// TestInflightProxy: requests through the proxy reach the server; one
// held open is counted in flight, a feed apart.
func TestInflightProxy(t *testing.T) {
	release := make(chan struct{})
	held := make(chan struct{}, 2)
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") == "1" {
			held <- struct{}{}
			<-release
		}
		w.Write([]byte(`{"ok":true}`))
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = backend.Serve(ln) }()
	defer backend.Close()
	p := startInflightProxy(t, "http://u:p@"+ln.Addr().String()+"/")
	done := make(chan error, 2)
	for _, q := range []string{"hold=1", "hold=1&feed=continuous"} {
		go func() {
			resp, err := http.Get(p.via(t, "http://u:p@"+ln.Addr().String()+"/db/_changes?"+q))
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
	}
	<-held
	<-held
	if c := p.counts(false); c.Inflight != 1 || c.Feeds != 1 || c.Total != 2 {
		t.Errorf("while held: %+v, want 1 in flight, 1 feed, 2 in all", c)
	}
	close(release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// The handler counts a request out once it returned, which can be
	// just after the client read the answer: poll.
	deadline := time.Now().Add(10 * time.Second)
	for c := p.counts(false); c.Inflight != 0 || c.Feeds != 0; c = p.counts(false) {
		if time.Now().After(deadline) {
			t.Fatalf("after: %+v, want nothing in flight", c)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c := p.counts(true); c.Peak != 1 || c.PeakFeeds != 1 {
		t.Errorf("after: %+v, want peaks of 1", c)
	}
}
