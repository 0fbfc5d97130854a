package replicate

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// InfoShareFor is how long an InfoShare hands an answer to the jobs that
// ask after it came: jobs started together (10,000 per-user jobs into one
// central database, 20 starting at a time per server) read the central
// database's info once a second, not once each.
const InfoShareFor = time.Second

// InfoShare shares the answers of GET /db (a database's info) and GET /
// (its server's) among the runs of a node that start together
// (Options.Infos): a run that asks while the same request (same URL,
// headers, credentials and proxy) is in flight, or was answered less than
// InfoShareFor ago, gets that answer. What a run takes from them stays
// true for that long as it does for a request of its own: the database
// exists and the credentials may read it (a database deleted meanwhile
// fails the run's next request, as it would a second later), its
// instance_start_time (a checkpoint's commit is checked against the
// target's at the checkpoint), its update_seq (a shared feed started at an
// older seq reads rows twice, none missed) and doc_count (an empty target
// only makes the first _revs_diff optional). Failures are never shared: a
// run whose shared request failed sends its own. It also holds the node's
// shared cookie sessions (couch.Sessions): the runs' endpoints on one
// server with the same credentials ask /_session once, not once each.
// Safe for concurrent use; the zero value is not usable, NewInfoShare
// returns one.
type InfoShare struct {
	sessions *couch.Sessions

	now   func() time.Time
	mu    sync.Mutex
	m     map[[sha256.Size]byte]*infoCall
	swept time.Time // the last sweep: at most one per InfoShareFor
}

// infoCall is one request whose answer is shared.
type infoCall struct {
	done   chan struct{} // closed when answered
	db     couch.DBInfo
	server couch.ServerInfo
	err    error
	sent   time.Time // when the request was sent: the answer is the server's state at or after it
	at     time.Time // when answered
}

// NewInfoShare returns an empty InfoShare.
func NewInfoShare() *InfoShare {
	return &InfoShare{sessions: couch.NewSessions(), now: time.Now, m: map[[sha256.Size]byte]*infoCall{}}
}

// infoKey is the digest of what shapes a GET of an endpoint: what (the
// database's info or its server's root), its URL, headers, credentials and
// proxy.
func infoKey(what string, ep EndpointParams) [sha256.Size]byte {
	b, _ := json.Marshal(struct {
		What string
		EP   EndpointParams
	}{what, ep})
	return sha256.Sum256(b)
}

// share returns the answer of the call under key: the one in flight or
// answered less than InfoShareFor ago, else get's (sent now, shared with
// whoever asks meanwhile). A shared call that failed is not reused: get is
// called.
func (s *InfoShare) share(ctx context.Context, key [sha256.Size]byte, get func(*infoCall)) (*infoCall, error) {
	now := s.now()
	s.mu.Lock()
	c := s.m[key]
	if c != nil {
		select {
		case <-c.done:
			if c.err != nil || now.Sub(c.at) >= InfoShareFor {
				c = nil
			}
		default:
		}
	}
	if c == nil {
		if now.Sub(s.swept) >= InfoShareFor {
			s.sweep(now)
		}
		c = &infoCall{done: make(chan struct{})}
		s.m[key] = c
		s.mu.Unlock()
		c.sent = now
		get(c)
		c.at = s.now()
		close(c.done)
		return c, c.err
	}
	s.mu.Unlock()
	select {
	case <-c.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if c.err != nil {
		own := &infoCall{sent: s.now()}
		get(own)
		return own, own.err
	}
	return c, nil
}

// sweep drops the answers too old to share, so that the map holds the
// last second's databases, not every database the node ever started a
// job of; s.mu is held.
func (s *InfoShare) sweep(now time.Time) {
	s.swept = now
	for k, c := range s.m {
		select {
		case <-c.done:
			if c.err != nil || now.Sub(c.at) >= InfoShareFor {
				delete(s.m, k)
			}
		default:
		}
	}
}

// dbInfo is db.Info shared through s (nil: db's own request), and when
// the request that answered was sent: the info is the database's state at
// that time or later (a shared answer may be up to InfoShareFor older than
// the ask).
func (s *InfoShare) dbInfo(ctx context.Context, ep EndpointParams, db *couch.DB) (couch.DBInfo, time.Time, error) {
	if s == nil {
		sent := time.Now()
		info, err := db.Info(ctx)
		return info, sent, err
	}
	c, err := s.share(ctx, infoKey("db", ep), func(c *infoCall) { c.db, c.err = db.Info(ctx) })
	if err != nil {
		return couch.DBInfo{}, time.Time{}, err
	}
	return c.db, c.sent, nil
}

// serverInfo is db.ServerInfo shared through s (nil: db's own request).
func (s *InfoShare) serverInfo(ctx context.Context, ep EndpointParams, db *couch.DB) (couch.ServerInfo, error) {
	if s == nil {
		return db.ServerInfo(ctx)
	}
	// One server's databases share its root: the key is the server's URL
	// with the endpoint's credentials (in the URL, or not).
	root := ep
	if e, err := endpointOf(ep); err == nil {
		u := e.ServerURL()
		root.URL = u.String() + "\x00" + e.Username + "\x00" + e.Password
	}
	c, err := s.share(ctx, infoKey("server", root), func(c *infoCall) { c.server, c.err = db.ServerInfo(ctx) })
	if err != nil {
		return couch.ServerInfo{}, err
	}
	return c.server, nil
}

// sessionOptions are the session options of the run's endpoints: the
// node's ([replicator] auth_plugins, session intervals), their cookies
// shared through Infos when set.
func (o Options) sessionOptions() *couch.SessionOptions {
	so := o.Endpoints.sessionOptions()
	if so != nil && o.Infos != nil {
		so.Shared = o.Infos.sessions
	}
	return so
}
