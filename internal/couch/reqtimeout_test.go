package couch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// attemptServer answers each request on a raw TCP connection with
// reply(attempt, c), attempt counting the requests from 1. The connection
// closes when reply returns. It returns the database URL (with a password
// that must never be shown) and the request counter.
func attemptServer(t *testing.T, reply func(attempt int64, c net.Conn, done <-chan struct{})) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var n atomic.Int64
	t.Cleanup(func() { close(done); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_ = req.Body.Close()
				reply(n.Add(1), c, done)
			}()
		}
	}()
	return "http://u:secret@" + ln.Addr().String() + "/db/", &n
}

// trickle sends head, then a space every 20 ms (far inside any read
// deadline) until the client hangs up or the test ends: a body that never
// completes.
func trickle(c net.Conn, head string, done <-chan struct{}) {
	if _, err := c.Write([]byte(head)); err != nil {
		return
	}
	for {
		select {
		case <-done:
			return
		case <-time.After(20 * time.Millisecond):
		}
		if _, err := c.Write([]byte(" ")); err != nil {
			return
		}
	}
}

const (
	infoJSON = `{"db_name":"db","update_seq":1,"instance_start_time":"0"}`
	chunked  = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
)

// TestRequestTimeout: request_timeout bounds each attempt of a request,
// headers and body (a body that trickles under the read deadline
// included); an attempt it ends is retried, and the error names the
// timeout; _changes feeds are not bounded by it.
func TestRequestTimeout(t *testing.T) {
	tests := []struct {
		name     string
		reply    func(attempt int64, c net.Conn, done <-chan struct{})
		call     func(ctx context.Context, d *DB) error
		want     string // error text; "" for success
		attempts int64
	}{
		{"headers never come",
			func(_ int64, c net.Conn, done <-chan struct{}) { <-done },
			func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err },
			"no complete response within 200ms (waiting for the response headers; request_timeout)", 3},
		{"body trickles forever",
			func(_ int64, c net.Conn, done <-chan struct{}) { trickle(c, chunked+`{"db_name":"db"`, done) },
			func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err },
			"no complete response within 200ms (in the response body; request_timeout)", 3},
		{"a retry gets the answer",
			func(attempt int64, c net.Conn, done <-chan struct{}) {
				if attempt == 1 {
					trickle(c, chunked+`{"db_name":"db"`, done)
					return
				}
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(infoJSON), infoJSON)
			},
			func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err },
			"", 2},
		{"_revs_diff body trickles",
			func(_ int64, c net.Conn, done <-chan struct{}) { trickle(c, chunked+`{"a":`, done) },
			func(ctx context.Context, d *DB) error {
				_, err := d.RevsDiff(ctx, map[string][]string{"a": {"1-a"}})
				return err
			},
			"(in the response body; request_timeout)", 3},
		{"open_revs trickles after a revision: not sent again",
			func(_ int64, c net.Conn, done <-chan struct{}) {
				trickle(c, chunked+`[{"ok":{"_id":"a","_rev":"1-a","_revisions":{"start":1,"ids":["a"]}}},`, done)
			},
			func(ctx context.Context, d *DB) error {
				return d.OpenRevs(ctx, "a", []string{"1-a", "2-b"}, nil, func(Doc) error { return nil })
			},
			"no complete response within 200ms (in the response body; request_timeout)", 1},
		{"_changes is not bounded",
			func(_ int64, c net.Conn, done <-chan struct{}) {
				fmt.Fprint(c, chunked+`{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-a"}]}`)
				// Five times request_timeout: a bounded feed would end here.
				select {
				case <-done:
					return
				case <-time.After(time.Second):
				}
				fmt.Fprint(c, `],"last_seq":1}`)
			},
			func(ctx context.Context, d *DB) error {
				_, err := d.Changes(ctx, ChangesOptions{}, func(Change) error { return nil })
				return err
			},
			"", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u, n := attemptServer(t, tc.reply)
			ep, err := ParseEndpoint(u)
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			d := NewDB(ep, Options{Retries: 2, RetryBackoff: time.Millisecond, RequestTimeout: 200 * time.Millisecond,
				Logger: zerolog.New(&logs), Limits: Limits{ReadTimeout: time.Minute}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = tc.call(ctx, d)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("error %v, want none", err)
			case tc.want != "" && (!errors.Is(err, ErrRequestTimeout) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one matching ErrRequestTimeout containing %q", err, tc.want)
			case err != nil && (!strings.Contains(err.Error(), "127.0.0.1") || strings.Contains(err.Error(), "secret")):
				t.Fatalf("error %q does not name the endpoint, or shows its password", err)
			}
			if got := n.Load(); got != tc.attempts {
				t.Fatalf("%d requests, want %d", got, tc.attempts)
			}
			if strings.Contains(logs.String(), "secret") {
				t.Fatalf("the password is in the logs: %s", logs.String())
			}
		})
	}
}

// TestStalledBodyRetried: a response whose body stops coming for
// connection_timeout (ErrStalled) is asked for again, like one that took
// longer than request_timeout, unless the caller was already handed part
// of it.
func TestStalledBodyRetried(t *testing.T) {
	stall := func(c net.Conn, head string, done <-chan struct{}) {
		if _, err := c.Write([]byte(head)); err == nil {
			<-done
		}
	}
	tests := []struct {
		name     string
		reply    func(attempt int64, c net.Conn, done <-chan struct{})
		call     func(ctx context.Context, d *DB) error
		want     string // error text; "" for success
		attempts int64
	}{
		{"a retry gets the answer",
			func(attempt int64, c net.Conn, done <-chan struct{}) {
				if attempt == 1 {
					stall(c, chunked+`{"db_name":"db"`, done)
					return
				}
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(infoJSON), infoJSON)
			},
			func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err },
			"", 2},
		{"every attempt stalls",
			func(_ int64, c net.Conn, done <-chan struct{}) { stall(c, chunked+`{"db_name":"db"`, done) },
			func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err },
			"nothing received for 200ms (in the response body", 3},
		{"open_revs stalls after a revision: not sent again",
			func(_ int64, c net.Conn, done <-chan struct{}) {
				stall(c, chunked+`[{"ok":{"_id":"a","_rev":"1-a","_revisions":{"start":1,"ids":["a"]}}},`, done)
			},
			func(ctx context.Context, d *DB) error {
				return d.OpenRevs(ctx, "a", []string{"1-a", "2-b"}, nil, func(Doc) error { return nil })
			},
			"in the response body", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u, n := attemptServer(t, tc.reply)
			ep, err := ParseEndpoint(u)
			if err != nil {
				t.Fatal(err)
			}
			d := NewDB(ep, Options{Retries: 2, RetryBackoff: time.Millisecond, Limits: Limits{ReadTimeout: 200 * time.Millisecond}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = tc.call(ctx, d)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("error %v, want none", err)
			case tc.want != "" && (!errors.Is(err, ErrStalled) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one matching ErrStalled containing %q", err, tc.want)
			}
			if got := n.Load(); got != tc.attempts {
				t.Fatalf("%d requests, want %d", got, tc.attempts)
			}
		})
	}
}
