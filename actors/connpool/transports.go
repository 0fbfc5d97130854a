package connpool

import (
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// transports are an incarnation's HTTP transports, one per pool key
// (couch.TransportOptions.PoolKey: endpoint host and port, proxy host and
// port, settings digest), each built once by couch.NewTransport and shared
// by every lease; safe for concurrent use (leases ask from job goroutines,
// never through the actor's mailbox).
type transports struct {
	cfg Config

	mu sync.Mutex
	m  map[string]*http.Transport
	// closedAt is when closeIdleOf last closed a transport's idle
	// connections; pending, that a close is due at the end of its gap.
	closedAt map[*http.Transport]time.Time
	pending  map[*http.Transport]bool
}

// closeIdleGap is the least time between two closeIdleOf of one
// transport: a thousand jobs parking together close its idle connections
// once a second, not a thousand times while others still start on it.
const closeIdleGap = time.Second

// closeIdleOf closes the idle connections of trs, each at most once per
// closeIdleGap: a transport closed less than that ago is closed again at
// the end of the gap (once), so the connections of the last jobs to park
// do not wait for connection_close_interval either.
func (t *transports) closeIdleOf(trs []*http.Transport) {
	now := time.Now()
	var due []*http.Transport
	t.mu.Lock()
	if t.closedAt == nil {
		t.closedAt, t.pending = map[*http.Transport]time.Time{}, map[*http.Transport]bool{}
	}
	for _, tr := range trs {
		switch since := now.Sub(t.closedAt[tr]); {
		case since >= closeIdleGap:
			t.closedAt[tr] = now
			due = append(due, tr)
		case !t.pending[tr]:
			t.pending[tr] = true
			time.AfterFunc(closeIdleGap-since, func() {
				t.mu.Lock()
				delete(t.pending, tr)
				t.closedAt[tr] = time.Now()
				t.mu.Unlock()
				tr.CloseIdleConnections()
			})
		}
	}
	t.mu.Unlock()
	for _, tr := range due {
		tr.CloseIdleConnections()
	}
}

func newTransports(cfg Config) *transports {
	return &transports{cfg: cfg, m: map[string]*http.Transport{}}
}

// get returns the transport of endpoint u (nil: any endpoint) with o.
func (t *transports) get(u *url.URL, o couch.TransportOptions) (*http.Transport, error) {
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = t.cfg.CloseInterval
	}
	if o.BufferSize == 0 {
		// Every continuous replication holds a connection open for its
		// feed, idle most of the time: small per-connection buffers
		// (net/http's default is 4 KiB each way) keep 1,000 idle jobs 6 MB
		// lighter. Bulk transfers do not go through them: request bodies
		// are written with the connection's ReadFrom, and reads of 1 KiB
		// and more bypass the read buffer.
		o.BufferSize = ConnBufferSize
	}
	key := o.PoolKey(u)
	t.mu.Lock()
	defer t.mu.Unlock()
	if tr, ok := t.m[key]; ok {
		return tr, nil
	}
	build := t.cfg.NewTransport
	if build == nil {
		build = couch.NewTransport
	}
	tr, err := build(o)
	if err != nil {
		return nil, err
	}
	t.m[key] = tr
	return tr, nil
}

// keys are the pool keys of the transports built so far, sorted.
func (t *transports) keys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Sorted(maps.Keys(t.m))
}

// closeIdle closes every transport's idle connections.
func (t *transports) closeIdle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tr := range t.m {
		tr.CloseIdleConnections()
	}
}
