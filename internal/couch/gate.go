package couch

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Gate admits one request to a server (its scheme and host:
// "http://127.0.0.1:5984") and returns the function that ends it; a nil
// release admits the request without counting it. A node's start-up limit
// ([replicator] startup_concurrency, internal/startlimit) is one: the
// requests of the jobs going through their start-up and of checkpoints, at
// most n in flight per server.
type Gate func(ctx context.Context, server string) (release func(), err error)

type gateKey struct{}

// WithGate returns ctx whose requests (every DB method called with it or a
// context derived from it) pass g first: a request waits for g's
// admission before it is sent, and ends once its response is read to its
// end or closed, or at its headers for a feed
// (feed=continuous|longpoll|eventsource: it may stay open for as long as
// the job runs).
func WithGate(ctx context.Context, g Gate) context.Context {
	return context.WithValue(ctx, gateKey{}, g)
}

func gateOf(ctx context.Context) Gate {
	g, _ := ctx.Value(gateKey{}).(Gate)
	return g
}

// gatedDo sends req through ctx's gate, if any.
func (d *DB) gatedDo(ctx context.Context, req *http.Request) (*http.Response, error) {
	g := gateOf(ctx)
	if g == nil {
		return d.client.Do(req)
	}
	release, err := g(ctx, req.URL.Scheme+"://"+req.URL.Host)
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	if release == nil {
		return d.client.Do(req)
	}
	resp, err := d.client.Do(req)
	if err != nil || isFeed(req.URL.RawQuery) {
		release()
		return resp, err
	}
	resp.Body = &gatedBody{ReadCloser: resp.Body, release: sync.OnceFunc(release)}
	return resp, nil
}

// isFeed reports whether a request's query asks for a long-lived feed.
func isFeed(query string) bool {
	for _, f := range []string{"feed=continuous", "feed=longpoll", "feed=eventsource"} {
		if strings.Contains(query, f) {
			return true
		}
	}
	return false
}

// gatedBody ends its request's admission at the body's end or close.
type gatedBody struct {
	io.ReadCloser
	release func()
}

func (b *gatedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.release()
	}
	return n, err
}

func (b *gatedBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}
