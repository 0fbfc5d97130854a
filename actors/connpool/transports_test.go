package connpool_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/couchrep/couchrep/actors/connpool"
	"github.com/couchrep/couchrep/internal/couch"
)

// TestClientForSharesTransportsByPoolKey: leases asking for the same
// endpoint, proxy and settings share one transport; another proxy, other
// proxy credentials or other TLS settings get their own; the keys never
// show credentials; a setting that cannot make a transport is an error.
func TestClientForSharesTransportsByPoolKey(t *testing.T) {
	b := setup(t, connpool.Config{})
	l1 := b.acquire(t, b.owner(t, "job1"), 4)
	l2 := b.acquire(t, b.owner(t, "job2"), 4)
	ep, _ := url.Parse("https://db.example:6984/src/")
	other, _ := url.Parse("https://other.example/src/")
	proxy := func(s string) couch.TransportOptions {
		p, _ := couch.ParseProxy(s)
		return couch.TransportOptions{Proxy: p}
	}
	for _, c := range []struct {
		l  *connpool.Lease
		u  *url.URL
		to couch.TransportOptions
	}{
		{l1, ep, couch.TransportOptions{}},
		{l2, ep, couch.TransportOptions{}}, // shared with the first
		{l1, other, couch.TransportOptions{}},
		{l1, ep, proxy("http://alice:secret1@proxy.example:3128")},
		{l2, ep, proxy("http://alice:secret1@proxy.example:3128")}, // shared
		{l2, ep, proxy("http://bob:secret2@proxy.example:3128")},
		{l2, ep, couch.TransportOptions{TLS: couch.TLSOptions{Verify: true}}},
	} {
		if _, err := c.l.ClientFor(c.u, c.to); err != nil {
			t.Fatal(err)
		}
	}
	keys := b.stats(t).Transports
	if len(keys) != 5 {
		t.Fatalf("%d transports, want 5: %q", len(keys), keys)
	}
	via := 0
	for _, k := range keys {
		if strings.Contains(k, "secret") || strings.Contains(k, "alice") || strings.Contains(k, "bob") {
			t.Errorf("pool key %q shows proxy credentials", k)
		}
		if strings.HasPrefix(k, "https://db.example:6984 via http://proxy.example:3128 #") {
			via++
		}
	}
	if via != 2 {
		t.Errorf("pool keys %q: want two db.example:6984 via proxy.example:3128 (one per proxy user)", keys)
	}
	if _, err := l1.ClientFor(ep, couch.TransportOptions{TLS: couch.TLSOptions{Verify: true, CAFile: "/nonexistent/ca.pem"}}); err == nil {
		t.Fatal("ClientFor with a missing CA file succeeded")
	}
	var _ http.RoundTripper = l1
}
