package ratelimiter

import (
	"context"
	"testing"

	"github.com/couchrep/couchrep/internal/couch"
)

// BenchmarkLimiter is the per-request cost of the node's rate limiter on
// the hot path: Wait then Success for a key with no interval (the common
// case), through the handle a job holds, from parallel goroutines.
func BenchmarkLimiter(b *testing.B) {
	bd := setup(b)
	ctx := context.Background()
	keys := []couch.LimitKey{
		{Endpoint: "http://a:5984/src/", Method: "POST"},
		{Endpoint: "http://b:5984/tgt/", Method: "POST"},
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			k := keys[i&1]
			i++
			if err := bd.lim.Wait(ctx, k); err != nil {
				b.Error(err)
				return
			}
			bd.lim.Success(k)
		}
	})
}
