package testserver

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestToxiproxyMissingBinary(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	_, err := toxiproxyInstalled()
	if err == nil || !strings.Contains(err.Error(), "run `make testdeps`") {
		t.Fatalf("without bin/toxiproxy-server: %v, want the hint to run make testdeps", err)
	}
}

// rawGet sends GET path on a new connection through l (Connection: close)
// and returns every byte read until the connection ended, and how it
// ended (nil for a clean EOF).
func rawGet(t *testing.T, l *Link, path string, readTimeout time.Duration) ([]byte, error) {
	t.Helper()
	c, err := l.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(readTimeout))
	var got bytes.Buffer
	_, err = io.Copy(&got, c)
	return got.Bytes(), err
}

func TestToxiproxy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts toxiproxy-server and pouchdb-server")
	}
	s := StartPouchDB(t)
	db := s.CreateDB(t, "wan")
	big := strings.Repeat("0123456789", 2000) // a 20 KB document
	s.PutRevs(t, db, Doc("big", []string{"1-a"}, map[string]any{"s": big}))
	tp := StartToxiproxy(t)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	fetch := func(t *testing.T, root string) []byte {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, root+"wan/big", nil)
		req.Header.Set("Accept-Encoding", "identity") // pouchdb-server gzips otherwise
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET through %s: %v", root, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET through %s: %d %v", root, resp.StatusCode, err)
		}
		return b
	}
	get := func(t *testing.T, l *Link) []byte { t.Helper(); return fetch(t, l.URL) }
	direct := fetch(t, s.URL)

	cases := []struct {
		name  string
		toxic func(t *testing.T, l *Link)
		check func(t *testing.T, l *Link)
	}{
		{"plain", nil, func(t *testing.T, l *Link) {
			if b := get(t, l); !bytes.Equal(b, direct) {
				t.Fatalf("through the link: %d bytes, direct %d", len(b), len(direct))
			}
			// toxiproxy counts a chunk after passing it on (its metrics
			// lag the bytes the client read): wait for the whole answer.
			st := l.Stats(t)
			for deadline := time.Now().Add(10 * time.Second); st.SentDown < int64(len(direct)) || st.SentUp == 0; {
				if time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
				st = l.Stats(t)
			}
			if st.ReceivedDown < int64(len(direct)) || st.SentDown != st.ReceivedDown || st.ReceivedUp == 0 || st.SentUp != st.ReceivedUp {
				t.Fatalf("toxiproxy's byte counts %+v, want the %d-byte answer downstream and the request upstream", st, len(direct))
			}
			if n := l.Connections(); n != 1 {
				t.Fatalf("toxiproxy's log shows %d connections, want 1:\n%s", n, l.tp.Log())
			}
		}},
		{"latency both ways", func(t *testing.T, l *Link) { l.Latency(t, 40*time.Millisecond, 5*time.Millisecond) }, func(t *testing.T, l *Link) {
			xs := l.Toxics(t)
			if len(xs) != 2 || xs[0].Type != "latency" || xs[1].Type != "latency" || xs[0].Stream == xs[1].Stream {
				t.Fatalf("toxics %+v, want latency on both streams", xs)
			}
			start := time.Now()
			if b := get(t, l); !bytes.Equal(b, direct) {
				t.Fatalf("through the link: %d bytes, direct %d", len(b), len(direct))
			}
			// A lower bound, which no machine can beat: the request and
			// the answer each wait 40 ± 5 ms.
			if el := time.Since(start); el < 70*time.Millisecond {
				t.Fatalf("a round trip through 2 × 40 ms took %s", el)
			}
		}},
		{"slicer", func(t *testing.T, l *Link) { l.Slicer(t, Downstream, 64, 32, 10*time.Microsecond) }, func(t *testing.T, l *Link) {
			if b := get(t, l); !bytes.Equal(b, direct) {
				t.Fatalf("sliced: %d bytes, direct %d", len(b), len(direct))
			}
		}},
		{"bandwidth per connection", func(t *testing.T, l *Link) { l.Bandwidth(t, Downstream, 100) }, func(t *testing.T, l *Link) {
			start := time.Now()
			if b := get(t, l); !bytes.Equal(b, direct) {
				t.Fatalf("through 100 KB/s: %d bytes, direct %d", len(b), len(direct))
			}
			if el := time.Since(start); el < 150*time.Millisecond {
				t.Fatalf("20 KB at 100 KB/s took %s", el)
			}
		}},
		{"limit_data cuts at a byte", func(t *testing.T, l *Link) { l.LimitData(t, Downstream, 300) }, func(t *testing.T, l *Link) {
			got, err := rawGet(t, l, "/wan/big", 30*time.Second)
			if err != nil || len(got) != 300 || !bytes.HasPrefix(got, []byte("HTTP/1.1 200")) {
				t.Fatalf("read %d bytes (%v), want the first 300 of the answer", len(got), err)
			}
		}},
		{"reset_peer", func(t *testing.T, l *Link) { l.ResetPeer(t, Upstream, 0) }, func(t *testing.T, l *Link) {
			got, err := rawGet(t, l, "/wan/big", 30*time.Second)
			if len(got) != 0 || !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("read %d bytes, %v; want a reset before any byte", len(got), err)
			}
		}},
		{"timeout stalls", func(t *testing.T, l *Link) { l.Timeout(t, Upstream, 0) }, func(t *testing.T, l *Link) {
			got, err := rawGet(t, l, "/wan/big", 300*time.Millisecond)
			if len(got) != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read %d bytes, %v; want nothing until the reader's deadline", len(got), err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := tp.Link(t, strings.ReplaceAll(c.name, " ", "_"), s.URL)
			if c.toxic != nil {
				c.toxic(t, l)
			}
			c.check(t, l)
		})
	}

	t.Run("remove a toxic", func(t *testing.T) {
		l := tp.Link(t, "removed", s.URL)
		name := l.Timeout(t, Downstream, 0)
		l.RemoveToxic(t, name)
		if xs := l.Toxics(t); len(xs) != 0 {
			t.Fatalf("toxics after removal: %+v", xs)
		}
		if b := get(t, l); !bytes.Equal(b, direct) {
			t.Fatalf("after removal: %d bytes", len(b))
		}
	})
}
