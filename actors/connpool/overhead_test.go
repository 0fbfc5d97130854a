package connpool

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
)

// cannedTransport answers every request at once without I/O.
type cannedTransport struct{}

func (cannedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

// BenchmarkLeaseOverhead is what a lease adds to each request, without the
// network: take a slot, wrap the request's context so the lease can cancel
// it, give the slot back on Close. "bare" is the same round trip on the
// canned transport alone.
func BenchmarkLeaseOverhead(b *testing.B) {
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:5984/db/_bulk_get", nil)
	for _, tc := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"bare", cannedTransport{}},
		{"lease", leaseTransport{l: newLease(actor.NewPID("nonhost", "owner"), 20, newTransports(Config{}), &counters{}, nil), tr: cannedTransport{}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := tc.rt.RoundTrip(req)
					if err != nil {
						b.Error(err)
						return
					}
					_ = resp.Body.Close()
				}
			})
		})
	}
}
