package connpool_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/couchrep/couchrep/actors/connpool"
	"github.com/couchrep/couchrep/internal/couch"
)

// BenchmarkRequest compares a GET through a lease (slot taken and given
// back per request, no actor involved) with the same GET on a bare
// transport, against a loopback server answering 2 bytes; and, for scale,
// one request/reply through the pool actor's mailbox (what a per-request
// acquire/release through the actor would add, twice).
func BenchmarkRequest(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	run := func(b *testing.B, c *http.Client) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := c.Get(srv.URL)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
	b.Run("bare_transport", func(b *testing.B) {
		// The transport a lease's requests go through, without the lease.
		tr, err := couch.NewTransport(couch.TransportOptions{BufferSize: connpool.ConnBufferSize})
		if err != nil {
			b.Fatal(err)
		}
		defer tr.CloseIdleConnections()
		run(b, &http.Client{Transport: tr})
	})
	b.Run("lease_20_slots", func(b *testing.B) {
		bd := setup(b, connpool.Config{})
		run(b, bd.acquire(b, bd.owner(b, "bench-owner"), 20).Client())
	})
	b.Run("actor_round_trip", func(b *testing.B) {
		bd := setup(b, connpool.Config{})
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := bd.pool.Stats(bd.ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
