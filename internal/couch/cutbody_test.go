package couch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestCutBodyRetried: an answer read whole whose connection ends before
// its body does (cut short of its Content-Length, or reset) is asked for
// again within retries_per_request, with or without a read deadline; an
// answer complete by its framing but not valid JSON is not (it would come
// the same); nor is one whose first revisions were handed on.
func TestCutBodyRetried(t *testing.T) {
	full := func(c net.Conn) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(infoJSON), infoJSON)
	}
	cut := func(c net.Conn) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(infoJSON), infoJSON[:20])
	}
	reset := func(c net.Conn) {
		cut(c)
		_ = c.(*net.TCPConn).SetLinger(0)
	}
	info := func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err }
	tests := []struct {
		name     string
		reply    func(attempt int64, c net.Conn, done <-chan struct{})
		call     func(ctx context.Context, d *DB) error
		want     error // nil for success
		attempts int64
	}{
		{"cut, then the answer",
			func(attempt int64, c net.Conn, _ <-chan struct{}) {
				if attempt == 1 {
					cut(c)
					return
				}
				full(c)
			}, info, nil, 2},
		{"reset, then the answer",
			func(attempt int64, c net.Conn, _ <-chan struct{}) {
				if attempt == 1 {
					reset(c)
					return
				}
				full(c)
			}, info, nil, 2},
		{"every answer cut",
			func(_ int64, c net.Conn, _ <-chan struct{}) { cut(c) }, info, io.ErrUnexpectedEOF, 3},
		{"whole but malformed: not sent again",
			func(_ int64, c net.Conn, _ <-chan struct{}) {
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\nConnection: close\r\n\r\n{\"db_name\":")
			}, info, ErrBadResponse, 1},
		{"open_revs cut after a revision: not sent again",
			func(_ int64, c net.Conn, _ <-chan struct{}) {
				body := `[{"ok":{"_id":"a","_rev":"1-a","_revisions":{"start":1,"ids":["a"]}}},{"ok":{"_id":"a"`
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body)+100, body)
			},
			func(ctx context.Context, d *DB) error {
				return d.OpenRevs(ctx, "a", []string{"1-a", "2-b"}, nil, func(Doc) error { return nil })
			}, io.ErrUnexpectedEOF, 1},
	}
	for _, tc := range tests {
		for _, readTimeout := range []time.Duration{0, time.Minute} {
			t.Run(fmt.Sprintf("%s/read deadline %s", tc.name, readTimeout), func(t *testing.T) {
				t.Parallel()
				u, n := attemptServer(t, tc.reply)
				ep, err := ParseEndpoint(u)
				if err != nil {
					t.Fatal(err)
				}
				d := NewDB(ep, Options{Retries: 2, RetryBackoff: time.Millisecond, Limits: Limits{ReadTimeout: readTimeout}})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				err = tc.call(ctx, d)
				switch {
				case tc.want == nil && err != nil:
					t.Fatalf("error %v, want none", err)
				case tc.want != nil && !errors.Is(err, tc.want) && !(tc.want == io.ErrUnexpectedEOF && strings.Contains(fmt.Sprint(err), "connection reset")):
					t.Fatalf("error %v, want one matching %v", err, tc.want)
				case err != nil && strings.Contains(err.Error(), "secret"):
					t.Fatalf("error %v shows the password", err)
				}
				if got := n.Load(); got != tc.attempts {
					t.Fatalf("%d requests, want %d", got, tc.attempts)
				}
			})
		}
	}
}
