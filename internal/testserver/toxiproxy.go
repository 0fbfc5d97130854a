package testserver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// toxiproxy (github.com/Shopify/toxiproxy/v2, its server built by `make
// testdeps` into ./bin/toxiproxy-server at the version pinned in the
// Makefile) puts a WAN between couchrep and a test server: a TCP proxy per
// Link whose toxics add latency (with jitter) to either direction, slice the
// bytes into small writes, cut a connection after some bytes, reset it or
// stall it. Toxics act on every connection of a link, on the bytes: they do
// not know HTTP requests (a fault aimed at one request type needs an HTTP
// proxy in the test).
//
// The bandwidth toxic limits each connection on its own: n connections
// through a link with a 100 KB/s toxic move up to n × 100 KB/s. It models a
// slow connection, never a link's capacity; do not present it as one.

// Toxiproxy is one toxiproxy-server process on a loopback port.
type Toxiproxy struct {
	*Proc
	// APIURL is the root of its HTTP API ("http://127.0.0.1:<port>/").
	APIURL string

	client *http.Client
}

// ToxiproxyBin returns the path of the pinned toxiproxy-server, ./bin of
// the repository (found by walking up from the working directory to
// go.mod).
func ToxiproxyBin() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "bin", "toxiproxy-server"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testserver: go.mod not found above the working directory")
		}
		dir = parent
	}
}

// toxiproxyInstalled returns ToxiproxyBin if it is there, else an error
// that says to run `make testdeps`.
func toxiproxyInstalled() (string, error) {
	bin, err := ToxiproxyBin()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("testserver: %s is not installed: run `make testdeps` (it builds toxiproxy's server at the pinned version)", bin)
	}
	return bin, nil
}

// StartToxiproxy starts toxiproxy-server on a free loopback port with
// its proxy metrics on (GET /metrics: bytes per link and direction) and
// its log (a JSON line per accepted connection, "Accepted client") in
// t.TempDir(); it is killed when the test ends. Without the binary the
// test fails: run `make testdeps`.
func StartToxiproxy(t testing.TB) *Toxiproxy {
	t.Helper()
	bin, err := toxiproxyInstalled()
	if err != nil {
		t.Fatal(err)
	}
	return retryOnPort(t, "toxiproxy-server", func(dir string, port int, addr string) (*Toxiproxy, error) {
		tp := &Toxiproxy{APIURL: "http://" + addr + "/", client: &http.Client{Timeout: 30 * time.Second,
			Transport: &http.Transport{DisableKeepAlives: true}}}
		ready := func() error {
			_, err := tp.api(http.MethodGet, "version", nil, http.StatusOK)
			return err
		}
		// env(1) sets its log level (info: a line per accepted
		// connection, nothing per chunk) and execs it.
		p, err := startProc(t, "toxiproxy-server", "/usr/bin/env", dir, filepath.Join(dir, "toxiproxy.log"),
			[]string{"LOG_LEVEL=info", bin, "-host", "127.0.0.1", "-port", strconv.Itoa(port), "-proxy-metrics"}, ready)
		if err != nil {
			return nil, err
		}
		tp.Proc = p
		return tp, nil
	})
}

// api sends a request to toxiproxy's HTTP API and returns the answer's
// body; a status other than want is an error.
func (tp *Toxiproxy) api(method, path string, body any, want int) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, tp.APIURL+path, rd)
	if err != nil {
		return nil, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := tp.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != want {
		return nil, fmt.Errorf("toxiproxy: %s /%s: status %d, want %d: %s", method, path, resp.StatusCode, want, bytes.TrimSpace(b))
	}
	return b, nil
}

// Link is one proxy of a Toxiproxy: a loopback listener forwarding every
// connection to one upstream server.
type Link struct {
	// Name is the proxy's name in toxiproxy's API, metrics and log.
	Name string
	// URL is the server root reached through the link
	// ("http://127.0.0.1:<listen port>/"), the upstream's path kept.
	URL string
	// Listen is the link's address.
	Listen string

	tp *Toxiproxy
}

// Link creates a proxy named name in front of the server at upstreamURL
// (an http:// URL on this machine) on a free loopback port, and returns
// it. Its URL replaces the upstream's host and port and keeps its path.
func (tp *Toxiproxy) Link(t testing.TB, name, upstreamURL string) *Link {
	t.Helper()
	u, err := url.Parse(upstreamURL)
	if err != nil || u.Host == "" {
		t.Fatalf("testserver: toxiproxy upstream %q is not a URL with a host", upstreamURL)
	}
	b, err := tp.api(http.MethodPost, "proxies", map[string]any{
		"name": name, "listen": "127.0.0.1:0", "upstream": u.Host, "enabled": true,
	}, http.StatusCreated)
	if err != nil {
		t.Fatalf("testserver: creating link %s: %v", name, err)
	}
	var p struct{ Listen string }
	if err := json.Unmarshal(b, &p); err != nil || p.Listen == "" {
		t.Fatalf("testserver: toxiproxy's answer to creating %s: %s (%v)", name, b, err)
	}
	pu := *u
	pu.Host = p.Listen
	return &Link{Name: name, URL: pu.String(), Listen: p.Listen, tp: tp}
}

// Toxic is one toxic of a link (toxiproxy's JSON).
type Toxic struct {
	// Name is unique on its link; AddToxic makes one from the type and
	// stream when empty.
	Name string `json:"name"`
	// Type: latency, bandwidth, slow_close, timeout, reset_peer, slicer,
	// limit_data.
	Type string `json:"type"`
	// Stream is Downstream (server to client) or Upstream (client to
	// server).
	Stream string `json:"stream"`
	// Toxicity is the probability that a connection is affected; 0 means
	// every connection (1.0).
	Toxicity float32 `json:"toxicity,omitempty"`
	// Attributes are the type's parameters (latency and jitter in ms,
	// bytes, timeout in ms, rate in KB/s, average_size, size_variation and
	// delay in µs).
	Attributes map[string]any `json:"attributes"`
}

// The streams of a link.
const (
	Downstream = "downstream" // server to client: the answers
	Upstream   = "upstream"   // client to server: the requests
)

// AddToxic adds a toxic to the link and returns its name. It acts on
// connections open at once (toxiproxy rebuilds their pipes).
func (l *Link) AddToxic(t testing.TB, x Toxic) string {
	t.Helper()
	if x.Name == "" {
		x.Name = x.Type + "_" + x.Stream
	}
	if x.Toxicity == 0 {
		x.Toxicity = 1
	}
	if _, err := l.tp.api(http.MethodPost, "proxies/"+url.PathEscape(l.Name)+"/toxics", x, http.StatusOK); err != nil {
		t.Fatalf("testserver: adding toxic %s to %s: %v", x.Name, l.Name, err)
	}
	return x.Name
}

// RemoveToxic removes the toxic named name.
func (l *Link) RemoveToxic(t testing.TB, name string) {
	t.Helper()
	if _, err := l.tp.api(http.MethodDelete, "proxies/"+url.PathEscape(l.Name)+"/toxics/"+url.PathEscape(name), nil, http.StatusNoContent); err != nil {
		t.Fatalf("testserver: removing toxic %s from %s: %v", name, l.Name, err)
	}
}

// Toxics lists the link's toxics.
func (l *Link) Toxics(t testing.TB) []Toxic {
	t.Helper()
	b, err := l.tp.api(http.MethodGet, "proxies/"+url.PathEscape(l.Name)+"/toxics", nil, http.StatusOK)
	if err != nil {
		t.Fatalf("testserver: toxics of %s: %v", l.Name, err)
	}
	var xs []Toxic
	if err := json.Unmarshal(b, &xs); err != nil {
		t.Fatalf("testserver: toxics of %s: %s: %v", l.Name, b, err)
	}
	return xs
}

// Latency delays both directions by oneWay (a round trip is 2 × oneWay
// plus the server's time), each chunk by up to jitter more or less.
func (l *Link) Latency(t testing.TB, oneWay, jitter time.Duration) {
	t.Helper()
	for _, s := range []string{Upstream, Downstream} {
		l.AddToxic(t, Toxic{Type: "latency", Stream: s, Attributes: map[string]any{
			"latency": oneWay.Milliseconds(), "jitter": jitter.Milliseconds()}})
	}
}

// Slicer cuts stream's bytes into writes of about avg bytes (± variation),
// delay apart.
func (l *Link) Slicer(t testing.TB, stream string, avg, variation int, delay time.Duration) string {
	t.Helper()
	return l.AddToxic(t, Toxic{Type: "slicer", Stream: stream, Attributes: map[string]any{
		"average_size": avg, "size_variation": variation, "delay": delay.Microseconds()}})
}

// LimitData closes each connection once n bytes have gone through stream
// on it.
func (l *Link) LimitData(t testing.TB, stream string, n int64) string {
	t.Helper()
	return l.AddToxic(t, Toxic{Type: "limit_data", Stream: stream, Attributes: map[string]any{"bytes": n}})
}

// ResetPeer resets (TCP RST) each connection after timeout from its first
// data on stream (0: at once).
func (l *Link) ResetPeer(t testing.TB, stream string, timeout time.Duration) string {
	t.Helper()
	return l.AddToxic(t, Toxic{Type: "reset_peer", Stream: stream, Attributes: map[string]any{"timeout": timeout.Milliseconds()}})
}

// Timeout stops every byte of stream and closes the connection after
// timeout (0: never: a stall).
func (l *Link) Timeout(t testing.TB, stream string, timeout time.Duration) string {
	t.Helper()
	return l.AddToxic(t, Toxic{Type: "timeout", Stream: stream, Attributes: map[string]any{"timeout": timeout.Milliseconds()}})
}

// Bandwidth limits stream to kbps KB/s per connection (not per link: see
// the package comment above).
func (l *Link) Bandwidth(t testing.TB, stream string, kbps int) string {
	t.Helper()
	return l.AddToxic(t, Toxic{Type: "bandwidth", Stream: stream, Attributes: map[string]any{"rate": kbps}})
}

// SetEnabled turns the link on or off; off closes its listener and every
// connection through it.
func (l *Link) SetEnabled(t testing.TB, on bool) {
	t.Helper()
	if _, err := l.tp.api(http.MethodPost, "proxies/"+url.PathEscape(l.Name), map[string]any{"enabled": on}, http.StatusOK); err != nil {
		t.Fatalf("testserver: enabling %s (%v): %v", l.Name, on, err)
	}
}

// LinkStats is toxiproxy's own count of a link's bytes (its
// toxiproxy_proxy_*_bytes_total metrics): Up is the requests' direction,
// Down the answers'; Received is what reached toxiproxy, Sent what it
// passed on after its toxics.
type LinkStats struct {
	ReceivedUp, SentUp, ReceivedDown, SentDown int64
}

// Stats reads the link's byte counters from toxiproxy's /metrics.
func (l *Link) Stats(t testing.TB) LinkStats {
	t.Helper()
	b, err := l.tp.api(http.MethodGet, "metrics", nil, http.StatusOK)
	if err != nil {
		t.Fatalf("testserver: toxiproxy metrics: %v", err)
	}
	var st LinkStats
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || !strings.Contains(line, `proxy="`+l.Name+`"`) {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		up := strings.Contains(line, `direction="upstream"`)
		switch {
		case strings.HasPrefix(line, "toxiproxy_proxy_received_bytes_total") && up:
			st.ReceivedUp = int64(v)
		case strings.HasPrefix(line, "toxiproxy_proxy_received_bytes_total"):
			st.ReceivedDown = int64(v)
		case strings.HasPrefix(line, "toxiproxy_proxy_sent_bytes_total") && up:
			st.SentUp = int64(v)
		case strings.HasPrefix(line, "toxiproxy_proxy_sent_bytes_total"):
			st.SentDown = int64(v)
		}
	}
	return st
}

// Connections counts the connections the link accepted, from toxiproxy's
// log ("Accepted client" lines naming the link).
func (l *Link) Connections() int {
	n := 0
	for _, line := range strings.Split(l.tp.Log(), "\n") {
		if !strings.Contains(line, "Accepted client") {
			continue
		}
		var e struct{ Name string }
		if json.Unmarshal([]byte(line), &e) == nil && e.Name == l.Name {
			n++
		}
	}
	return n
}

// Dial opens a raw TCP connection through the link (tests of the link
// itself).
func (l *Link) Dial() (net.Conn, error) {
	return net.DialTimeout("tcp", l.Listen, 10*time.Second)
}
