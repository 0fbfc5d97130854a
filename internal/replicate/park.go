package replicate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/dbupdates"
	"github.com/couchrep/couchrep/internal/redact"
)

// Parking (Options.Park): a continuous run that has had no change for
// Params.IdleParkAfter, with nothing in flight and its feed working, ends
// with a final checkpoint and a Result whose Parked is set. Its feed (its
// own, or its subscription to the shared one) is closed, its workers,
// batch buffer and timers are gone, and the connections of transports it
// built are closed; what it keeps is the Parked value: the source's
// client and the seq it is parked at. The caller waits for its source to
// change (Parked.Moved) and starts a new run, from the checkpoint.

// errParked is the pipeline's cause when the run parks.
var errParked = errors.New("replication: parked")

// Parked is a continuous run that parked: the source it reads and the seq
// it is parked at (its checkpoint). It holds no goroutine and no
// connection of its own; Moved reads the source. Not safe for concurrent
// use.
type Parked struct {
	src *couch.DB
	// seq is the checkpointed seq: the run replicated every change up to
	// it. base is the source's update_seq known to hold no change after
	// seq (nil: seq itself): a write that changes no document (a
	// _security or _revs_limit update) moves update_seq without a change.
	seq, base couch.Seq
	since     time.Time
	style     string
	// own are the transports the run built (none with a connection
	// pool's clients): their idle connections are closed after each look.
	own []*http.Transport
	// Resume is set when the run read a change it did not finish before it
	// parked (it came in as the run was parking): start again at once.
	Resume bool
	// moved, when set, answers Moved (NewParked).
	moved func(context.Context) (bool, error)
	// quietAt: the run parked without reading a change (quietParkAfter),
	// its source known to hold none after seq as of this time.
	quietAt time.Time
}

// Quiet reports, for a run that parked without replicating anything (it
// found nothing to replicate at start-up: quietParkAfter), since when the
// source was known to hold no change after Seq: the sending of the info
// request that said so, which may be older than the run (the node's runs
// share an info read within a second, InfoShare). ok is false for any
// other park. A change written before the caller's wake-up source opened
// and after that time may be one the run's feed had not delivered yet
// when it parked: the caller looks at the source once (Changed).
func (pk *Parked) Quiet() (since time.Time, ok bool) { return pk.quietAt, !pk.quietAt.IsZero() }

// NewParked returns a Parked at seq since then whose Moved calls moved:
// for an engine of the caller's own (jobrunner.Options.Engine in tests and
// benchmarks).
func NewParked(seq couch.Seq, since time.Time, moved func(context.Context) (bool, error)) *Parked {
	return &Parked{seq: seq, since: since, moved: moved}
}

// MarkQuiet makes pk a quiet run's, its source known to hold no change
// after Seq as of at (Quiet): for an engine of the caller's own, as
// NewParked.
func (pk *Parked) MarkQuiet(at time.Time) { pk.quietAt = at }

// Seq is the seq the job is parked at: every change up to it is
// replicated and checkpointed.
func (pk *Parked) Seq() couch.Seq { return seqOrZero(pk.seq) }

// Since is when the run parked.
func (pk *Parked) Since() time.Time { return pk.since }

// Moved reports whether the source database has a change after the parked
// seq: its update_seq (GET /db) is past what the job knows (compared by
// the number where both have one, else any difference), and a _changes
// read from the parked seq (limit=1, unfiltered) has a row. Comparing
// update_seq alone would wake the job again and again for a write that
// changes no document; a change the job's filter would drop wakes it once
// per event. An error (the source unreachable, its database deleted) is
// returned with moved set: a new run reports it as a run does.
func (pk *Parked) Moved(ctx context.Context) (moved bool, err error) {
	if pk.moved != nil {
		return pk.moved(ctx)
	}
	defer func() {
		for _, tr := range pk.own {
			tr.CloseIdleConnections()
		}
	}()
	info, err := pk.src.Info(ctx)
	if err != nil {
		return true, err
	}
	base := pk.base
	if base == nil {
		base = pk.seq
	}
	if !SeqPast(info.UpdateSeq, base) {
		return false, nil
	}
	if moved, err := pk.changed(ctx); moved || err != nil {
		return true, err
	}
	pk.base = info.UpdateSeq
	return false, nil
}

// Changed reports whether the source has a change after the parked seq: a
// _changes read from it (limit=1, unfiltered) has a row. It is Moved
// without the update_seq step, for a wake-up that says the database was
// written (a _db_updates row): one request instead of two. An error is
// returned with moved set, as Moved's.
func (pk *Parked) Changed(ctx context.Context) (moved bool, err error) {
	if pk.moved != nil {
		return pk.moved(ctx)
	}
	defer func() {
		for _, tr := range pk.own {
			tr.CloseIdleConnections()
		}
	}()
	return pk.changed(ctx)
}

func (pk *Parked) changed(ctx context.Context) (bool, error) {
	opts := couch.ChangesOptions{Feed: couch.FeedNormal, Since: pk.seq, Limit: 1, Style: pk.style}
	rows := 0
	if _, err := pk.src.ReadChangesEnd(ctx, &opts, func(couch.Change) error { rows++; return nil }); err != nil {
		return true, err
	}
	return rows > 0, nil
}

// SeqPast reports whether the source's update_seq u is past the seq s a
// job knows: u > s where both have a number (a JSON number, or the number
// before the "-" of CouchDB's opaque seqs), else any difference. The zero
// seq is 0.
func SeqPast(u, s couch.Seq) bool {
	x, ok1 := seqNumber(u)
	y, ok2 := seqNumber(s)
	if ok1 && ok2 {
		return x > y
	}
	return !u.Equal(s)
}

// CompactSeq is s as SeqPast compares it, in fewer bytes: the number of a
// seq that has one (CouchDB 2+'s "N-opaque" seqs are hundreds of bytes),
// else s. SeqPast(u, CompactSeq(s)) is SeqPast(u, s) for every u that has
// a number, and for a u that has none a difference still.
func CompactSeq(s couch.Seq) couch.Seq {
	if n, ok := seqNumber(s); ok {
		return couch.Seq(strconv.FormatInt(n, 10))
	}
	return s
}

// seqNumber is a seq's number: a JSON number, a string of one, or the
// prefix before "-" of CouchDB 2+'s "N-opaque".
func seqNumber(s couch.Seq) (int64, bool) {
	if n, ok := s.Int(); ok {
		return n, true
	}
	str := string(s)
	if len(str) < 2 || str[0] != '"' {
		return 0, false
	}
	head, _, ok := strings.Cut(str[1:len(str)-1], "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(head, 10, 64)
	return n, err == nil
}

// parking is a run's idle state, read by its timers (runTimers.fire) to
// decide when it parks.
type parking struct {
	// active is when the run last saw activity (unix nanoseconds): a batch
	// cut, or its feed (re)opened.
	active atomic.Int64
	// live is set while the changes reader waits on a feed that works: its
	// own continuous request under way, or a caught-up subscription to the
	// shared feed.
	live atomic.Bool
}

// touch records activity now.
func (pk *parking) touch() { pk.active.Store(time.Now().UnixNano()) }

// feedLive records that the reader waits on a working feed (on) or not.
func (pk *parking) feedLive(on bool) {
	if on {
		pk.touch()
	}
	pk.live.Store(on)
}

// parks reports whether the run may park at all.
func (r *Replication) parks() bool {
	return r.o.Park && r.p.Continuous && r.p.UseCheckpoints && r.p.IdleParkAfter > 0
}

// parksLater reports whether a run that may not park now asks again
// (Options.ParkLater).
func (r *Replication) parksLater() bool {
	return !r.o.Park && r.o.ParkLater != nil && r.p.Continuous && r.p.UseCheckpoints && r.p.IdleParkAfter > 0
}

// quietParkAfter is how long a run that found nothing to replicate at
// start-up (its source had no change after its checkpoint) waits with its
// feed working before it parks, instead of idle_park_after: a node
// starting thousands of jobs that are up to date (a restart, or new
// per-user jobs of empty databases) parks each a few seconds after its
// start rather than holding all their feeds, workers and buffers for a
// minute; a change read first makes it an ordinary run. Short enough that
// the start of thousands of jobs never has them all running at once, long
// enough for a change written just before the start to reach the feed.
const quietParkAfter = 2 * time.Second

// quiet reports whether the run is still as it started with nothing to
// replicate: it did (quietAt) and has cut no batch since. s.mu is held.
func (s *runState) quiet() bool {
	return !s.quietAt.IsZero() && s.cutSeq == nil
}

// parkAfter is how long the run waits idle before it parks:
// idle_park_after, or quietParkAfter while quiet.
func (s *runState) parkAfter() time.Duration {
	s.mu.Lock()
	quiet := s.quiet()
	s.mu.Unlock()
	if quiet {
		return min(s.r.p.IdleParkAfter, quietParkAfter)
	}
	return s.r.p.IdleParkAfter
}

// parkDue is when the run may park, as seen at now: its last activity
// plus idle_park_after (parkAfter) while its feed works and nothing is in
// flight, else that long from now (looked at again then).
func (s *runState) parkDue(now time.Time) time.Time {
	after := s.parkAfter()
	s.mu.Lock()
	bt, inFlight := s.bt, s.tracker.low < s.tracker.next
	s.mu.Unlock()
	if !s.park.live.Load() || inFlight || bt == nil || !bt.empty() {
		return now.Add(after)
	}
	return time.Unix(0, s.park.active.Load()).Add(after)
}

// parked ends a run that parked: the final checkpoint, and the Result with
// Parked set. A run stopped meanwhile ends as stopped instead.
func (s *runState) parked(ctx context.Context) (Result, error) {
	if ctx.Err() != nil {
		return s.finish(ctx, true)
	}
	res, err := s.finishAs(ctx, false, "parked")
	if err != nil {
		return res, err
	}
	r := s.r
	var opts couch.ChangesOptions
	r.changesOptions(&opts, nil)
	// Only the source's client and the transports the run built stay
	// referenced: the engine, its target and its state are garbage.
	res.Parked = &Parked{src: r.src, seq: s.through(), since: r.now(), style: opts.Style, own: r.ownTrs,
		Resume: s.inFlight() || s.bt != nil && s.bt.dropped}
	s.mu.Lock()
	if s.quiet() {
		res.Parked.quietAt = s.quietAt
	}
	s.mu.Unlock()
	return res, nil
}

// ParksOnDBUpdates reports whether a run of p parks on its source server's
// _db_updates feed: a continuous replication of the whole source (no
// filter, doc_ids or selector: a write to its database concerns it), with
// checkpoints (a parked job resumes from one) and idle_park_after set.
func ParksOnDBUpdates(p Params) bool {
	return p.Continuous && p.UseCheckpoints && p.IdleParkAfter > 0 &&
		p.Filter == "" && p.DocIDs == nil && p.Selector == nil
}

// DBUpdatesServer is the server whose _db_updates feed wakes a parked run
// of p, and the name of p's source database in its rows: the source's
// server root (its URL without the database's path segment) with the
// source's credentials, headers, proxy, TLS and socket settings, opened as
// the shared changes feed's connections are (openFeedDB: connections of
// its own). The Key is a digest of all that, so jobs with other
// credentials never share a feed.
func DBUpdatesServer(p Params, o Options) (dbupdates.Server, string, error) {
	ep, err := endpointOf(p.Source)
	if err != nil {
		return dbupdates.Server{}, "", fmt.Errorf("source: %w", err)
	}
	root := ep.ServerURL()
	db := dbupdates.DBName(ep)
	if db == "" {
		return dbupdates.Server{}, "", fmt.Errorf("source: no database name in %s", ep)
	}
	src := p.Source
	src.URL = root.String()
	key, _ := json.Marshal(struct {
		Source            EndpointParams
		User, Pass        string
		Socket            string
		ConnectionTimeout time.Duration
		Retries           int
	}{src, ep.Username, ep.Password, p.SocketOptions, p.ConnectionTimeout, p.RetriesPerRequest})
	sum := sha256.Sum256(key)
	return dbupdates.Server{
		Key:  hex.EncodeToString(sum[:]),
		Name: redact.URL(root.String()),
		Open: func(log zerolog.Logger) (*couch.DB, func(), error) {
			return openFeedDB(p, o, log)
		},
	}, db, nil
}

// OpenParked returns the Parked of a job of p that parked at seq (its
// checkpoint) since then, for a look at its source without a run: a
// hibernated job woken up (actors/jobrunner) has only its record. The
// source is opened as a run opens it (o's clients or a transport of its
// own, closed after each look); nothing is sent until Moved or Changed.
func OpenParked(p Params, o Options, seq couch.Seq, since time.Time) (*Parked, error) {
	r := New(p, o)
	if err := r.openDBs(); err != nil {
		return nil, err
	}
	var opts couch.ChangesOptions
	r.changesOptions(&opts, nil)
	return &Parked{src: r.src, seq: seq, since: since, style: opts.Style, own: r.ownTrs}, nil
}
