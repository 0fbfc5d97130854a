package couch

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

// rawServer answers every request on a raw TCP connection with reply,
// which writes whatever it likes (well-behaved servers cannot misbehave
// on command). It returns the database URL.
func rawServer(t *testing.T, reply func(c net.Conn)) string {
	t.Helper()
	u, _ := attemptServer(t, func(_ int64, c net.Conn, done <-chan struct{}) {
		reply(c)
		<-done // hold the connection open until the test ends
	})
	return u
}

func TestLimits(t *testing.T) {
	big := strings.Repeat("x", 4096)
	tests := []struct {
		name  string
		reply string // raw bytes sent; the connection then stays open and silent
		call  func(ctx context.Context, d *DB) error
		want  error
		text  string
	}{
		{"no headers", "", func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err },
			ErrStalled, "nothing received for 300ms (waiting for the response headers"},
		{"half the headers", "HTTP/1.1 200 OK\r\nContent-", func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err },
			ErrStalled, "waiting for the response headers"},
		{"stall after headers", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"db_name\"",
			func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err }, ErrStalled, "in the response body"},
		{"10 GB content length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10737418240\r\n\r\n{}",
			func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err },
			ErrResponseTooLarge, "response body of 10737418240 bytes (Content-Length) is more than the limit of 2048 bytes"},
		{"body beyond the limit", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"db_name\":\"" + big + "\"}",
			func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err },
			ErrResponseTooLarge, "response body is more than the limit of 2048 bytes"},
		{"document beyond the limit", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"_id\":\"" + big + "\"}",
			func(ctx context.Context, d *DB) error { _, err := d.GetDoc(ctx, "x", nil); return err },
			ErrResponseTooLarge, "document is more than the limit of 1024 bytes"},
		{"endless _changes row", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"seq\":1,\"id\":\"" + big,
			func(ctx context.Context, d *DB) error {
				_, err := d.Changes(ctx, ChangesOptions{Feed: FeedContinuous}, func(Change) error { return nil })
				return err
			}, ErrResponseTooLarge, "_changes row is more than the limit of 1024 bytes"},
		{"_bulk_get document beyond the limit", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"results\":[{\"id\":\"a\",\"docs\":[{\"ok\":{\"_id\":\"" + big,
			func(ctx context.Context, d *DB) error {
				return d.BulkGet(ctx, []BulkGetRequest{{ID: "a", Rev: "1-a"}}, func(Doc) error { return nil })
			}, ErrResponseTooLarge, "_bulk_get result (one document's revisions) is more than the limit of 1024 bytes"},
		{"_revisions not matching _rev", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 116\r\n\r\n" +
			`{"results":[{"id":"a","docs":[{"ok":{"_id":"a","_rev":"2-b","_revisions":{"start":7,"ids":["b","a"]}}}]}]}` + strings.Repeat(" ", 9),
			func(ctx context.Context, d *DB) error {
				return d.BulkGet(ctx, []BulkGetRequest{{ID: "a", Rev: "2-b"}}, func(Doc) error { return nil })
			}, ErrBadResponse, `_revisions (start 7, 2 ids, first "b") does not match _rev "2-b"`},
		{"garbage", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n<html>oops</html>",
			func(ctx context.Context, d *DB) error { _, err := d.Info(ctx); return err }, ErrBadResponse, "invalid character '<'"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u, _ := url.Parse(rawServer(t, func(c net.Conn) { _, _ = c.Write([]byte(tc.reply)) }))
			ep, err := ParseEndpoint(u.String())
			if err != nil {
				t.Fatal(err)
			}
			d := NewDB(ep, Options{Limits: Limits{ReadTimeout: 300 * time.Millisecond, MaxDocumentBytes: 1024, MaxLineBytes: 1024, MaxBodyBytes: 2048}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = tc.call(ctx, d)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("error %v, want one matching %v containing %q", err, tc.want, tc.text)
			}
			if !strings.Contains(err.Error(), "127.0.0.1") || strings.Contains(err.Error(), "secret") {
				t.Fatalf("error %q does not name the endpoint, or shows its password", err)
			}
		})
	}
}
