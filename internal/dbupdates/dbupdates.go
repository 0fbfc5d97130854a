// Package dbupdates wakes parked replication jobs when their source
// database changes: a Hub keeps one continuous _db_updates feed open per
// source server (per Server.Key: the server's root URL, the credentials
// and the connection settings), shared by every Watch of that server on
// the node, and signals the watches of the database each row names.
//
// # The feed
//
// The first Watch of a Key opens its feed: a probe
// (GET /_db_updates?since=now, a normal feed that answers at once) fixes a
// seq S and tells whether the server lets us read the feed at all; then
// GET /_db_updates?feed=continuous&heartbeat=...&since=S follows it,
// advancing S with every row. Every database event after the probe
// answered has a seq after S, so Watch returns as soon as the probe did:
// a change made after Watch returned wakes the watch (its row may still be
// on its way). When the last Watch of a Key closes, the feed closes.
//
// A feed that ends is read again from S: at once when the server ended it
// or when it was cut after being read for a while (a connection closed, or
// no byte for 2×heartbeat+5 s: a stall), after a backoff for other
// failures (a 5xx, a malformed or oversized row); no event is lost. When
// the server rejects S (400: it restarted without its old seqs) the feed
// probes again for a new S and wakes every watch, because events between
// the two may be lost: a lost event costs a wake-up, never a missed
// change. A server whose probe names no seq is followed from since=now,
// and every watch is woken each time such a feed starts, for the same
// reason. The rows' database names map to the watches through one map per
// feed (a row costs a map look-up, whatever the number of watches), and a
// Watch's channel holds at most one signal (wake-ups coalesce). Rows are
// read with package couch's limits: a row beyond couch.MaxDBUpdatesRowBytes
// is an error, never buffered whole.
//
// # Where _db_updates cannot be read
//
// The probe's 400 (PouchDB Server's stub), 401/403 (the credentials are not
// a server admin's: CouchDB 3.4.3 checks that first and answers 401 "You
// are not a server admin."), 404 (CouchDB without its _global_changes
// database: a single_node set-up of 3.4.3 has none), 405, 500 and 501 make
// Watch return an error matching ErrUnsupported. The verdict is cached per
// Key for Options.UnsupportedFor (5 minutes), so that ten thousand jobs of
// one server do not each probe it; a job that gets ErrUnsupported keeps a
// _changes feed of its own. A 401/403 is a verdict on the credentials, not
// on the server: the error also matches ErrNotAdmin, the Key's state is
// StateNotAdmin, and Stats counts it apart (NotAdmin), so that one job
// with a user's credentials does not make a server whose feed its admin
// jobs read look unsupported. The same statuses (5xx excepted: retried) on a
// feed that was already read, or a 400 for the seq the server's own probe
// just gave, end the feed: its watches are signalled and Watch.Err says
// why. Other failures before the feed was first read are transient: Watch
// returns them and the caller treats them as a failed request of its own.
//
// Each change of a server's state (ok, retrying, unsupported) is logged
// once, with the server's redacted name and the reason; Stats gives the
// same for _up and /metrics.
//
// _db_updates reveals database names only: the Hub reads it with the
// credentials Server.Open connects with (the watched server's admin, or the
// job's own) and never reads anything else with them.
package dbupdates

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/pause"
	"github.com/couchrep/couchrep/internal/redact"
)

// ErrUnsupported matches Watch's error (and Watch.Err) when the server's
// _db_updates cannot be read: 400 (PouchDB Server's stub), 401/403 (not a
// server admin), 404 (CouchDB without _global_changes), 405, 500 or 501.
// The error wraps it with the request, the server's status and
// error/reason, credentials redacted.
var ErrUnsupported = errors.New("dbupdates: the server's _db_updates cannot be read")

// ErrNotAdmin matches, besides ErrUnsupported, the error of a Watch whose
// credentials the server refused (401/403: not a server admin's): the
// server may serve _db_updates to other credentials.
var ErrNotAdmin = errors.New("dbupdates: the credentials are not a server admin's")

// Defaults of Options.
const (
	// DefaultHeartbeat is the feed's heartbeat=.
	DefaultHeartbeat = 10 * time.Second
	// DefaultUnsupportedFor is how long an unsupported verdict is cached.
	DefaultUnsupportedFor = 5 * time.Minute
	// DefaultRetryMin and DefaultRetryMax bound the backoff between two
	// attempts to read a failing feed.
	DefaultRetryMin = time.Second
	DefaultRetryMax = time.Minute
)

// Options tune a Hub.
type Options struct {
	// Logger receives the feeds' logs (never a Server's Key).
	Logger zerolog.Logger
	// Heartbeat is the feeds' heartbeat= and stall detection; zero is
	// DefaultHeartbeat. A feed lowers it to a third of its connection's
	// read timeout (connection_timeout) if that is shorter: CouchDB sends
	// no headers before the first heartbeat (couch.DBUpdatesOptions).
	Heartbeat time.Duration
	// StallAfter is how long a feed may send nothing (not even a
	// heartbeat) before it is presumed dead and read again; zero is
	// 2×Heartbeat+5 s.
	StallAfter time.Duration
	// UnsupportedFor is how long Watch answers ErrUnsupported for a Key
	// without asking the server again; zero is DefaultUnsupportedFor.
	UnsupportedFor time.Duration
	// RetryMin and RetryMax bound the backoff between two attempts of a
	// failing feed; zero are DefaultRetryMin and DefaultRetryMax.
	RetryMin, RetryMax time.Duration
}

// Server is the server a feed reads.
type Server struct {
	// Key identifies the feed: watches with equal keys share one. It must
	// cover everything that shapes the request or its connection (server
	// root URL, credentials, headers, proxy, TLS and socket settings), so
	// that watches with different credentials never share; a digest keeps
	// credentials out of it. It is never logged.
	Key string
	// Name is the server for logs and Stats, credentials redacted.
	Name string
	// Open returns a client of the server (any database of it: the feed is
	// read at its server root) and a function that releases its
	// connections when the feed ends; called once per feed, whose
	// connections are its own.
	Open func(log zerolog.Logger) (db *couch.DB, release func(), err error)
}

// State is a server's state in the Hub.
type State string

// The states of a server.
const (
	// StateOpening: the first probe of the feed is under way.
	StateOpening State = "opening"
	// StateOK: the feed is read.
	StateOK State = "ok"
	// StateRetrying: the feed was read and failed; it is read again after
	// a backoff (its watches stay; no event is lost unless the server
	// rejects the feed's seq, which wakes them all).
	StateRetrying State = "retrying"
	// StateUnsupported: the server's _db_updates cannot be read (Reason).
	StateUnsupported State = "unsupported"
	// StateNotAdmin: the server refused these credentials (401/403: not
	// a server admin's); other credentials may read its _db_updates.
	StateNotAdmin State = "not_admin"
)

// Hub is a node's set of _db_updates feeds. Its zero value is not usable;
// New returns one. It is safe for concurrent use.
type Hub struct {
	log zerolog.Logger
	o   Options

	mu      sync.Mutex
	feeds   map[string]*feed
	servers map[string]*server // by Key: state of every server seen lately
	wakes   atomic.Uint64
}

// server is what the Hub remembers of a Key beyond its feed: the state it
// logged last, and the unsupported verdict.
type server struct {
	name   string
	state  State
	reason string
	since  time.Time // state's start
	err    error     // StateUnsupported, StateNotAdmin: Watch's error until until
	until  time.Time
}

// New returns an empty Hub.
func New(o Options) *Hub {
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.UnsupportedFor <= 0 {
		o.UnsupportedFor = DefaultUnsupportedFor
	}
	if o.RetryMin <= 0 {
		o.RetryMin = DefaultRetryMin
	}
	if o.RetryMax <= 0 {
		o.RetryMax = DefaultRetryMax
	}
	o.RetryMax = max(o.RetryMax, o.RetryMin)
	return &Hub{log: o.Logger, o: o, feeds: map[string]*feed{}, servers: map[string]*server{}}
}

// ServerStats is one server's line in Stats.
type ServerStats struct {
	// Name is the server, redacted.
	Name string `json:"server"`
	// State is opening, ok, retrying, unsupported or not_admin (one
	// line per Key: a server read with several credentials has several).
	State State `json:"state"`
	// Reason says why a server is retrying, unsupported or not_admin.
	Reason string `json:"reason,omitempty"`
	// Since is when the server entered State.
	Since time.Time `json:"since"`
	// Watches are the server's watches on this node.
	Watches int `json:"watches"`
}

// Stats are a Hub's counts.
type Stats struct {
	// Feeds open (or opening), and their watches.
	Feeds, Watches int
	// Unsupported counts the servers (by Name) found unsupported at their
	// last probe (their jobs keep their feeds; the verdict is listed after
	// its cache expired, until a new probe says otherwise). Credentials
	// refused with 401/403 do not count: see NotAdmin.
	Unsupported int
	// NotAdmin counts the credentials (Keys) the servers refused with
	// 401/403 at their last probe: their jobs keep their own feeds, while
	// other credentials of the same server may read its _db_updates.
	NotAdmin int
	// Wakes counts the signals sent to watches since the Hub was made.
	Wakes uint64
	// Servers lists the servers with a feed, and those found unsupported,
	// by Name.
	Servers []ServerStats
}

// Stats counts the Hub's feeds and watches and lists its servers.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := Stats{Feeds: len(h.feeds), Wakes: h.wakes.Load()}
	unsupported := map[string]bool{}
	for key, s := range h.servers {
		f := h.feeds[key]
		if f == nil && !s.state.refused() {
			continue
		}
		ss := ServerStats{Name: s.name, State: s.state, Reason: s.reason, Since: s.since}
		switch s.state {
		case StateUnsupported:
			unsupported[s.name] = true
		case StateNotAdmin:
			st.NotAdmin++
		}
		if f != nil {
			f.mu.Lock()
			ss.Watches = f.n
			f.mu.Unlock()
			st.Watches += ss.Watches
		}
		st.Servers = append(st.Servers, ss)
	}
	st.Unsupported = len(unsupported)
	sort.Slice(st.Servers, func(i, j int) bool { return st.Servers[i].Name < st.Servers[j].Name })
	return st
}

// refused reports a cached verdict: unsupported or not_admin.
func (st State) refused() bool { return st == StateUnsupported || st == StateNotAdmin }

// Watch watches db (its name as in _db_updates rows, unescaped) on srv's
// feed, opening the feed if none is open. It returns once the feed is
// known readable (its probe answered, now or for an earlier Watch): every
// change to db after Watch returns signals the Watch. It returns an error
// matching ErrUnsupported when the server's _db_updates cannot be read
// (cached per Key for Options.UnsupportedFor), ctx's error, or another
// error (transient: the probe failed; treat it as a failed request).
func (h *Hub) Watch(ctx context.Context, srv Server, db string) (*Watch, error) {
	w := &Watch{db: db, c: make(chan struct{}, 1)}
	h.mu.Lock()
	if s := h.servers[srv.Key]; s != nil && s.state.refused() && time.Now().Before(s.until) {
		err := s.err
		h.mu.Unlock()
		return nil, err
	}
	f := h.feeds[srv.Key]
	if f == nil {
		f = h.newFeed(srv)
		h.feeds[srv.Key] = f
		h.setState(srv.Key, srv.Name, StateOpening, "", nil, false)
		go f.run()
	}
	f.add(w)
	h.mu.Unlock()
	select {
	case <-f.ready:
	case <-ctx.Done():
		w.Close()
		return nil, ctx.Err()
	}
	if f.readyErr != nil {
		w.Close()
		return nil, f.readyErr
	}
	if err := w.Err(); err != nil {
		// The feed ended for good just after it started.
		w.Close()
		return nil, err
	}
	return w, nil
}

// stallAfter is how long a request may go without a byte.
func (h *Hub) stallAfter() time.Duration {
	if h.o.StallAfter > 0 {
		return h.o.StallAfter
	}
	return 2*h.o.Heartbeat + 5*time.Second
}

// setState records key's state, logging a change (h.mu held).
func (h *Hub) setState(key, name string, st State, reason string, err error, log bool) {
	s := h.servers[key]
	if s == nil {
		h.pruneServers()
		s = &server{}
		h.servers[key] = s
	}
	if st == StateOpening && s.state != "" {
		// A new feed of a known server: it shows what was found last
		// until its probe answers.
		s.name = name
		return
	}
	changed := s.state != st
	s.name, s.reason = name, reason
	if st.refused() {
		s.err, s.until = err, time.Now().Add(h.o.UnsupportedFor)
	} else {
		s.err, s.until = nil, time.Time{}
	}
	if !changed {
		return
	}
	s.state, s.since = st, time.Now()
	if !log {
		return
	}
	switch st {
	case StateOK:
		h.log.Info().Str("server", name).Msg("db_updates: reading the server's _db_updates: parked jobs wake on their database's changes")
	case StateRetrying:
		h.log.Warn().Str("server", name).Str("reason", reason).Msg("db_updates: the server's _db_updates feed failed; reading it again after a backoff")
	case StateUnsupported:
		h.log.Warn().Str("server", name).Str("reason", reason).Msg("db_updates: the server's _db_updates cannot be read: its jobs keep _changes feeds of their own")
	case StateNotAdmin:
		h.log.Info().Str("server", name).Str("reason", reason).Msg("db_updates: the server refused a job's credentials for _db_updates (not a server admin's): the jobs with them keep _changes feeds of their own")
	}
}

// maxServers bounds the servers remembered without a feed.
const maxServers = 10000

// pruneServers forgets servers without a feed whose verdict expired, once
// there are many (h.mu held).
func (h *Hub) pruneServers() {
	if len(h.servers) < maxServers {
		return
	}
	now := time.Now()
	for k, s := range h.servers {
		if h.feeds[k] == nil && !now.Before(s.until) {
			delete(h.servers, k)
		}
	}
}

// DBName is the name _db_updates rows give the database of ep (the last
// segment of its path, unescaped: "userdb-6a6f65", "a/b" for .../a%2Fb/),
// the db to pass to Watch; "" when ep has no database segment.
func DBName(ep couch.Endpoint) string {
	if ep.URL == nil {
		return ""
	}
	p := strings.TrimSuffix(ep.URL.EscapedPath(), "/")
	seg := p[strings.LastIndexByte(p, '/')+1:]
	name, err := url.PathUnescape(seg)
	if err != nil {
		return seg
	}
	return name
}

// Watch is one database watched on a server's feed.
type Watch struct {
	f  *feed
	db string
	c  chan struct{}

	mu     sync.Mutex
	err    error
	closed bool
	// notify, when set, is called at every signal (OnSignal).
	notify atomic.Pointer[func()]
}

// OnSignal makes every later signal of w also call f, on the feed's
// goroutine (f must return at once: hand the work to a goroutine of its
// own), so that a parked job needs no goroutine waiting on C; nil stops
// that. C is signalled as before.
func (w *Watch) OnSignal(f func()) {
	if f == nil {
		w.notify.Store(nil)
		return
	}
	w.notify.Store(&f)
}

// C is signalled (at most one signal waits: they coalesce) after a row
// naming the watched database (created, updated or deleted), after the
// feed restarted in a way that may have lost events, and when the feed
// ended for good (Err is then set).
func (w *Watch) C() <-chan struct{} { return w.c }

// Err is nil while the watch works; once its feed ended for good (the
// server's _db_updates can no longer be read: it matches ErrUnsupported) it
// says why, and C was signalled: close the Watch and go back to reading
// the database's own feed.
func (w *Watch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// DB is the watched database's name.
func (w *Watch) DB() string { return w.db }

// Server is the watched database's server as the rechecks of parked jobs
// read it (park.Rechecks.Look): the feed's client, at the server's root,
// with the feed's credentials and connection settings; its Key is the
// feed's. A request while the feed has no client (it ended) fails.
func (w *Watch) Server() park.Server { return w.f }

// errNoClient: the feed is not (or no longer) connected to its server.
var errNoClient = errors.New("dbupdates: the feed has no client of its server")

// Key is the feed's Server.Key (park.Server).
func (f *feed) Key() string { return f.srv.Key }

// DBsInfo is POST /_dbs_info on the feed's server (park.Server).
func (f *feed) DBsInfo(ctx context.Context, dbs []string) ([]couch.DBsInfoResult, error) {
	db := f.client.Load()
	if db == nil {
		return nil, errNoClient
	}
	return db.DBsInfo(ctx, dbs)
}

// InfoOf is GET /db on the feed's server (park.Server).
func (f *feed) InfoOf(ctx context.Context, name string) (couch.DBInfo, error) {
	db := f.client.Load()
	if db == nil {
		return couch.DBInfo{}, errNoClient
	}
	return db.InfoOf(ctx, name)
}

// Close ends the watch; the feed closes with its last one. Closing twice is
// harmless.
func (w *Watch) Close() {
	if w.f != nil {
		w.f.remove(w)
	}
}

func (w *Watch) signal() bool {
	if f := w.notify.Load(); f != nil {
		(*f)()
	}
	select {
	case w.c <- struct{}{}:
		return true
	default:
		return false
	}
}

func (w *Watch) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	w.signal()
}

// feed is one server's shared _db_updates feed.
type feed struct {
	h      *Hub
	srv    Server
	log    zerolog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	// ready is closed once the feed's probe answered, or failed (readyErr,
	// written before).
	ready    chan struct{}
	readyErr error
	// client is the feed's client of its server while run has one (for
	// the rechecks' requests, park.Server).
	client atomic.Pointer[couch.DB]

	mu    sync.Mutex
	byDB  map[string][]*Watch
	n     int // watches
	ended bool
}

func (h *Hub) newFeed(srv Server) *feed {
	f := &feed{h: h, srv: srv, log: h.log.With().Str("server", srv.Name).Logger(), ready: make(chan struct{}),
		byDB: map[string][]*Watch{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f
}

// add registers w; h.mu is held and f is in h.feeds.
func (f *feed) add(w *Watch) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.f = f
	f.byDB[w.db] = append(f.byDB[w.db], w)
	f.n++
}

// remove unregisters w and closes the feed when it was the last watch.
func (f *feed) remove(w *Watch) {
	h := f.h
	h.mu.Lock()
	defer h.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	w.mu.Unlock()
	l := f.byDB[w.db]
	for i, x := range l {
		if x == w {
			l[i] = l[len(l)-1]
			l[len(l)-1] = nil
			l = l[:len(l)-1]
			f.n--
			break
		}
	}
	if len(l) == 0 {
		delete(f.byDB, w.db)
	} else {
		f.byDB[w.db] = l
	}
	if f.n == 0 && !f.ended {
		f.ended = true
		if h.feeds[f.srv.Key] == f {
			delete(h.feeds, f.srv.Key)
		}
		f.cancel()
	}
}

// end takes the feed out of the Hub and fails every watch with err.
func (f *feed) end(err error) {
	h := f.h
	h.mu.Lock()
	if h.feeds[f.srv.Key] == f {
		delete(h.feeds, f.srv.Key)
	}
	f.mu.Lock()
	f.ended = true
	var ws []*Watch
	for _, l := range f.byDB {
		ws = append(ws, l...)
	}
	f.mu.Unlock()
	h.mu.Unlock()
	for _, w := range ws {
		w.fail(err)
	}
	f.cancel()
}

// dispatch signals db's watches.
func (f *feed) dispatch(db string) {
	f.mu.Lock()
	n := uint64(0)
	for _, w := range f.byDB[db] {
		if w.signal() {
			n++
		}
	}
	f.mu.Unlock()
	if n > 0 {
		f.h.wakes.Add(n)
	}
}

// wakeAll signals every watch: events may have been lost.
func (f *feed) wakeAll() {
	f.mu.Lock()
	n := uint64(0)
	for _, l := range f.byDB {
		for _, w := range l {
			if w.signal() {
				n++
			}
		}
	}
	f.mu.Unlock()
	f.h.wakes.Add(n)
}

func (f *feed) setState(st State, reason string, err error) {
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	f.h.setState(f.srv.Key, f.srv.Name, st, reason, err, true)
}

// unsupported turns err into the ErrUnsupported error, and the state to
// record, when its status says _db_updates cannot be read with these
// credentials: StateNotAdmin for a 401/403 (the error matches ErrNotAdmin
// too), StateUnsupported for the others; nil otherwise.
func unsupported(err error) (State, error) {
	var he *couch.HTTPError
	if !errors.As(err, &he) {
		return "", nil
	}
	switch he.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		return StateNotAdmin, fmt.Errorf("%w: %w: %w", ErrUnsupported, ErrNotAdmin, redact.Error(err))
	case http.StatusBadRequest, http.StatusNotFound,
		http.StatusMethodNotAllowed, http.StatusInternalServerError, http.StatusNotImplemented:
		return StateUnsupported, fmt.Errorf("%w: %w", ErrUnsupported, redact.Error(err))
	}
	return "", nil
}

// cut reports whether err is a feed's connection that died (a stall, a
// connection closed or reset between rows) rather than an answer that
// could not be read.
func cut(err error) bool {
	var ne net.Error
	return errors.Is(err, couch.ErrFeedStalled) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.As(err, &ne)
}

// status is err's HTTP status, or 0.
func status(err error) int {
	var he *couch.HTTPError
	if errors.As(err, &he) {
		return he.Status
	}
	return 0
}

// reasonOf is err's text for logs and Stats, redacted.
func reasonOf(err error) string {
	var he *couch.HTTPError
	if errors.As(err, &he) {
		s := fmt.Sprintf("%d", he.Status)
		switch {
		case he.ErrorName != "" && he.Reason != "":
			s += " " + he.ErrorName + ": " + he.Reason
		case he.ErrorName != "":
			s += " " + he.ErrorName
		case he.Reason != "":
			s += " " + he.Reason
		default:
			s += " " + http.StatusText(he.Status)
		}
		return redact.Text(s)
	}
	return redact.Text(err.Error())
}

// probe fixes the feed's start: the server's current seq.
func (f *feed) probe(db *couch.DB) (couch.Seq, error) {
	ctx, cancel := context.WithTimeout(f.ctx, f.h.stallAfter())
	defer cancel()
	seq, err := db.DBUpdatesSeq(ctx)
	if err != nil && ctx.Err() != nil && f.ctx.Err() == nil {
		err = fmt.Errorf("dbupdates: GET %s_db_updates?since=now: no answer within %s: %w", f.srv.Name, f.h.stallAfter(), couch.ErrStalled)
	}
	if err != nil {
		return nil, err
	}
	if seq.IsZero() || seq.Equal(couch.SinceNow) {
		return couch.SinceNow, nil
	}
	return seq, nil
}

// run reads the feed until it ends for good or its last watch leaves.
func (f *feed) run() {
	db, release, err := f.srv.Open(f.log)
	if err != nil {
		f.readyErr = fmt.Errorf("dbupdates: %s: %w", f.srv.Name, redact.Error(err))
		f.failStart(f.readyErr)
		return
	}
	defer release()
	f.client.Store(db)
	defer f.client.Store(nil)
	since, err := f.probe(db)
	if err != nil {
		if f.ctx.Err() != nil {
			f.readyErr = f.ctx.Err()
			close(f.ready)
			return
		}
		if st, u := unsupported(err); u != nil {
			f.readyErr = u
			f.setState(st, reasonOf(err), u)
		} else {
			f.readyErr = fmt.Errorf("dbupdates: %s: %w", f.srv.Name, redact.Error(err))
		}
		f.failStart(f.readyErr)
		return
	}
	close(f.ready)
	f.setState(StateOK, "", nil)
	f.follow(db, since)
}

// failStart ends a feed whose start failed: its waiting Watch calls return
// readyErr.
func (f *feed) failStart(err error) {
	close(f.ready)
	f.end(err)
}

// follow reads the continuous feed from since, again after every end,
// until the last watch leaves or the server refuses the feed for good.
func (f *feed) follow(db *couch.DB, since couch.Seq) {
	backoff := pause.Backoff{Min: f.h.o.RetryMin, Max: f.h.o.RetryMax}
	// rejected: the last attempt's seq was rejected and a new one probed;
	// the server rejecting that one too cannot serve the feed.
	rejected := false
	for {
		began := time.Now()
		rows := 0
		opened := false
		fromNow := since.Equal(couch.SinceNow)
		opts := couch.DBUpdatesOptions{Since: since, Heartbeat: f.h.o.Heartbeat, StallAfter: f.h.o.StallAfter, Opened: func() {
			opened, rejected = true, false
			backoff.Reset()
			f.setState(StateOK, "", nil)
			if fromNow {
				// The server gave no seq to start from (its probe's
				// last_seq): events before this feed began may be
				// missing from it.
				f.wakeAll()
			}
		}}
		last, err := db.DBUpdates(f.ctx, &opts, func(u couch.DBUpdate) error {
			rows++
			f.dispatch(u.DBName)
			return nil
		})
		if f.ctx.Err() != nil {
			return
		}
		if last != nil {
			since = last
		}
		if err == nil {
			// The server ended the feed: read on from its last seq, after
			// a pause if it ended at once without a row.
			if rows == 0 && time.Since(began) < f.h.o.Heartbeat {
				if pause.For(f.ctx, f.h.o.RetryMin) != nil {
					return
				}
			}
			continue
		}
		if opened && time.Since(began) >= f.h.o.RetryMin && cut(err) {
			// A feed that was read for a while broke (a stall, a cut
			// connection): read on from its seq at once, quietly.
			f.log.Debug().Err(err).Str("since", since.String()).Msg("db_updates: feed ended; reading on")
			continue
		}
		if status(err) == http.StatusBadRequest && !since.Equal(couch.SinceNow) && !rejected {
			// The server rejects the seq (it restarted, or its feed was
			// rebuilt): start again from now, and wake every watch for
			// the events in between.
			f.log.Warn().Str("reason", reasonOf(err)).Msg("db_updates: the server rejected the feed's seq; waking every watch and reading on from now")
			seq, perr := f.probe(db)
			if perr == nil {
				since, rejected = seq, true
				f.wakeAll()
				continue
			}
			err = perr
		}
		if st, u := unsupported(err); u != nil && status(err) < 500 {
			f.setState(st, reasonOf(err), u)
			f.end(u)
			return
		}
		f.setState(StateRetrying, reasonOf(err), nil)
		if pause.For(f.ctx, backoff.Next()) != nil {
			return
		}
	}
}
