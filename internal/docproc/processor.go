package docproc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/pause"
	"github.com/couchrep/couchrep/internal/takeover"
)

// Defaults for Options.
const (
	// DefaultPollInterval is how often _all_dbs is polled where there is
	// no _db_updates: CouchDB's interval/2.
	DefaultPollInterval = 30 * time.Second
	// DefaultLeaseTTL is how long a database lease lasts unless renewed
	// (it is renewed every third of it).
	DefaultLeaseTTL = 30 * time.Second
	// DefaultFeedTimeout is the timeout of each _changes and _db_updates
	// request; the feed is then requested again from where it ended.
	DefaultFeedTimeout = 60 * time.Second
)

// Options configure a Processor.
type Options struct {
	// Servers are the watched CouchDB server URLs ([couchrep] watch); they
	// may carry credentials.
	Servers []string
	// Node names this node in leases.
	Node string
	// Store is the shared job store; Prefix is prepended to every key.
	Store  kv.Database
	Prefix []byte
	// Jobs is the replication job store.
	Jobs JobStore
	// Logger receives structured logs.
	Logger zerolog.Logger
	// HTTPClient sends the requests; nil means couch's default client.
	HTTPClient *http.Client
	// Retries is retries_per_request for the doc processor's requests.
	Retries int
	// PollInterval, LeaseTTL and FeedTimeout: zero means the default.
	PollInterval time.Duration
	LeaseTTL     time.Duration
	FeedTimeout  time.Duration
	// CreateReplicatorDB creates a missing _replicator database on each
	// watched server ([replicator] create_replicator_db).
	CreateReplicatorDB bool
	// UpdateDocs is [replicator] update_docs: a terminal state written
	// into a document carries its _replication_id (false: none).
	UpdateDocs bool
	// Clock returns the time for leases and state times; nil means time.Now.
	Clock func() time.Time
	// Competition records what the check for competing replicators finds
	// on the watched servers (GET /_up, couchrepctl nodes read it); nil
	// means a new one.
	Competition *Competition
	// OnCompeting is [couchrep] on_competing_replicator: "warn" (or empty)
	// or "refuse" (leave competing databases alone).
	OnCompeting string
	// CompetingInterval is how often each server is checked (and this
	// store's marker refreshed); zero means PollInterval.
	CompetingInterval time.Duration
	// ServerUUID is the node's server uuid, written into this store's
	// marker (informative).
	ServerUUID string
}

// Processor turns _replicator documents into jobs (see the package
// documentation). Create it with New and call Run.
type Processor struct {
	opts    Options
	log     zerolog.Logger
	keys    keyspace
	servers []server

	comp *Competition
	// storeID is the job store's id, named by the marker (Run sets it).
	storeID string

	mu     sync.Mutex
	leased map[dbKey]*dbProc   // databases this processor follows now
	known  map[string][]string // discovery's latest _replicator databases per server
	marked map[dbKey]bool      // databases this processor wrote its marker into
}

// server is one watched server.
type server struct {
	key string         // URL without credentials: the store's name for it
	ep  couch.Endpoint // the server root, with credentials
}

type dbKey struct{ server, db string }

// New returns a Processor. It fails if a server URL cannot be parsed.
func New(opts Options) (*Processor, error) {
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.FeedTimeout <= 0 {
		opts.FeedTimeout = DefaultFeedTimeout
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.CompetingInterval <= 0 {
		opts.CompetingInterval = opts.PollInterval
	}
	if opts.Competition == nil {
		opts.Competition = NewCompetition()
	}
	if opts.Store == nil || opts.Jobs == nil {
		return nil, errors.New("docproc: Store and Jobs are required")
	}
	p := &Processor{opts: opts, log: opts.Logger.With().Str("component", "doc_processor").Logger(),
		keys: newKeyspace(opts.Prefix), leased: map[dbKey]*dbProc{}, known: map[string][]string{}, marked: map[dbKey]bool{}, comp: opts.Competition}
	action := "warn"
	if p.refuse() {
		action = "refuse"
	}
	for _, s := range opts.Servers {
		ep, err := couch.ParseEndpoint(s)
		if err != nil {
			return nil, fmt.Errorf("docproc: watched server %q: %w", s, err)
		}
		p.servers = append(p.servers, server{key: ep.Redacted(), ep: ep})
		p.comp.register(ep.Redacted(), action)
	}
	return p, nil
}

func (p *Processor) couchOpts() couch.Options {
	return couch.Options{HTTPClient: p.opts.HTTPClient, Logger: p.log, Retries: p.opts.Retries}
}

// dbEndpoint is the endpoint of database name on s.
func (s server) dbEndpoint(name string) couch.Endpoint {
	u := *s.ep.URL
	base := u.EscapedPath()
	if base == "" || base[len(base)-1] != '/' {
		base += "/"
	}
	raw := base + url.PathEscape(name) + "/"
	u.RawPath = raw
	u.Path, _ = url.PathUnescape(raw)
	ep := s.ep
	ep.URL = &u
	return ep
}

// snapshot is the set of _replicator databases a server has now.
type snapshot struct {
	server int
	dbs    map[string]bool
}

// Run processes the watched servers until ctx ends; it then releases its
// leases and returns nil. It returns an error only if the job store fails
// in a way it cannot retry.
func (p *Processor) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	defer wg.Wait()

	// Servers no node watches any more are forgotten before anything else
	// runs: their documents' jobs must not run again.
	if _, err := p.ForgetUnwatched(ctx); err != nil && ctx.Err() == nil {
		p.log.Warn().Err(err).Msg("forgetting servers no longer watched failed; trying again at the next start")
	}

	// The marker this store writes into the databases it follows names
	// the store (internal/takeover).
	id, err := takeover.StoreID(ctx, p.opts.Store)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("docproc: %w", err)
	}
	p.storeID = id

	// Follow job state changes first, so that no terminal state is missed
	// between a database's scan of unwritten records and the feed.
	followErr := make(chan error, 1)
	started := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := p.opts.Jobs.Follow(ctx, func() { close(started) }, p.onJobChange(ctx))
		if ctx.Err() == nil {
			followErr <- fmt.Errorf("docproc: following job states: %w", err)
		}
	}()
	select {
	case <-started:
	case err := <-followErr:
		return err
	case <-ctx.Done():
		return nil
	}

	snaps := make(chan snapshot)
	for i := range p.servers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			p.discover(ctx, i, snaps)
		}()
		go func() {
			defer wg.Done()
			p.watchCompetition(ctx, i)
		}()
	}
	type runner struct {
		cancel context.CancelCauseFunc
		done   chan struct{}
	}
	runners := map[dbKey]*runner{}
	exited := make(chan dbKey)
	for {
		select {
		case <-ctx.Done():
			for _, r := range runners {
				r.cancel(context.Canceled)
			}
			return nil
		case err := <-followErr:
			return err
		case k := <-exited:
			delete(runners, k)
		case s := <-snaps:
			srv := p.servers[s.server]
			p.setKnown(srv.key, s.dbs)
			for k, r := range runners {
				if k.server == srv.key && !s.dbs[k.db] {
					r.cancel(errDBDeleted)
				}
			}
			for db := range s.dbs {
				k := dbKey{srv.key, db}
				if runners[k] != nil {
					continue
				}
				rctx, rcancel := context.WithCancelCause(ctx)
				r := &runner{cancel: rcancel, done: make(chan struct{})}
				runners[k] = r
				wg.Add(1)
				go func() {
					defer wg.Done()
					p.runDB(rctx, srv, db)
					rcancel(nil)
					select {
					case exited <- k:
					case <-ctx.Done():
					}
				}()
			}
		}
	}
}

var (
	// errDBDeleted cancels a database's runner when discovery no longer
	// lists the database.
	errDBDeleted = errors.New("docproc: database deleted")
	// errLeaseLost cancels a database's follower when its lease was taken.
	errLeaseLost = errors.New("docproc: lease lost")
	// errCompeting cancels a database's follower when the server's own
	// replicator runs jobs for it and on_competing_replicator is refuse.
	errCompeting = errors.New("docproc: the server's own replicator runs jobs for this database")
)

// runDB follows one _replicator database whenever this node holds its
// lease, until ctx ends.
func (p *Processor) runDB(ctx context.Context, srv server, db string) {
	log := p.log.With().Str("server", srv.key).Str("db", db).Logger()
	st := &state{store: p.opts.Store, keys: p.keys, server: srv.key, db: db}
	retry := p.opts.LeaseTTL / 3
	for {
		stop := func() { p.stopCompetingJobs(ctx, srv, st, log) }
		if err := p.waitAllowed(ctx, dbKey{srv.key, db}, stop); err != nil {
			if errors.Is(err, errDBDeleted) {
				p.dbDeleted(srv, st, log)
			}
			return
		}
		ok, err := st.acquire(ctx, p.opts.Node, p.opts.Clock(), p.opts.LeaseTTL)
		if err != nil && ctx.Err() == nil {
			log.Warn().Err(err).Msg("taking lease failed")
		}
		if ok {
			err = p.leasedRun(ctx, srv, st, log)
			if errors.Is(err, errDBDeleted) || errors.Is(context.Cause(ctx), errDBDeleted) {
				if !p.dbDeleted(srv, st, log) || ctx.Err() != nil {
					return
				}
				continue // created again meanwhile: follow the new one
			}
			if ctx.Err() != nil || errors.Is(err, errCompeting) {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				if err := st.release(rctx, p.opts.Node); err != nil {
					log.Warn().Err(err).Msg("releasing lease failed")
				}
				cancel()
				if ctx.Err() != nil {
					return
				}
				log.Warn().Msg("stopped following: the server's own replicator runs jobs for this database (on_competing_replicator = refuse)")
				continue
			}
			log.Info().Err(err).Msg("stopped following")
		}
		if pause.For(ctx, retry) != nil {
			if errors.Is(context.Cause(ctx), errDBDeleted) {
				p.dbDeleted(srv, st, log)
			}
			return
		}
	}
}

// dbDeleted removes the jobs of a deleted database, if this node holds (or
// can take) its lease: another node may already follow a new database of
// the same name. It reports whether the database is there again (or was
// never gone): its jobs are then kept, and the follower's start removes
// them if it is a new database (a checkpoint beyond its update_seq).
func (p *Processor) dbDeleted(srv server, st *state, log zerolog.Logger) (back bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ok, err := st.acquire(ctx, p.opts.Node, p.opts.Clock(), p.opts.LeaseTTL)
	if err != nil || !ok {
		return false
	}
	defer func() { _ = st.release(ctx, p.opts.Node) }()
	if _, err := couch.NewDB(srv.dbEndpoint(st.db), p.couchOpts()).Info(ctx); err == nil {
		return true
	}
	n, err := p.removeDBJobs(ctx, st, log)
	if err != nil {
		log.Error().Err(err).Msg("removing the jobs of a deleted database failed")
		return false
	}
	log.Info().Int("jobs_removed", n).Msg("database deleted: jobs removed")
	return false
}

// removeDBJobs removes the jobs of every document recorded for st's
// database, then forgets its records and checkpoint; it returns how many
// jobs it removed.
func (p *Processor) removeDBJobs(ctx context.Context, st *state, log zerolog.Logger) (int, error) {
	recs, err := st.records(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for id, rec := range recs {
		if rec.JobID == "" {
			continue
		}
		if err := p.opts.Jobs.Remove(ctx, rec.JobID); err != nil && !errors.Is(err, ErrJobNotFound) {
			return n, fmt.Errorf("docproc: remove job of %s/%s: %w", st.db, id, err)
		}
		n++
	}
	if err := st.forget(ctx); err != nil {
		return n, err
	}
	log.Debug().Int("jobs_removed", n).Msg("database's jobs removed, its records forgotten")
	return n, nil
}

// leasedRun follows the database while the lease is renewed.
func (p *Processor) leasedRun(ctx context.Context, srv server, st *state, log zerolog.Logger) error {
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	competing := make(chan struct{})
	go func() {
		defer close(competing)
		p.stopWhenCompeting(lctx, dbKey{srv.key, st.db}, cancel)
	}()
	defer func() { <-competing }()
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		last := p.opts.Clock()
		for pause.For(lctx, p.opts.LeaseTTL/3) == nil {
			ok, err := st.acquire(lctx, p.opts.Node, p.opts.Clock(), p.opts.LeaseTTL)
			switch {
			case err == nil && ok:
				last = p.opts.Clock()
			case err == nil:
				cancel(errLeaseLost)
				return
			case p.opts.Clock().Sub(last) > p.opts.LeaseTTL*2/3:
				log.Warn().Err(err).Msg("lease not renewed in time")
				cancel(errLeaseLost)
				return
			}
		}
	}()
	defer func() { <-renewed }()
	defer cancel(nil)
	d := &dbProc{p: p, srv: srv, st: st, log: log, db: couch.NewDB(srv.dbEndpoint(st.db), p.couchOpts())}
	k := dbKey{srv.key, st.db}
	p.mu.Lock()
	p.leased[k] = d
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		if p.leased[k] == d {
			delete(p.leased, k)
		}
		p.mu.Unlock()
	}()
	log.Info().Msg("following _replicator database")
	err := d.follow(lctx)
	if c := context.Cause(lctx); lctx.Err() != nil && c != nil {
		return c
	}
	return err
}

// onJobChange writes terminal states of persistent jobs of databases this
// node follows back to their documents.
func (p *Processor) onJobChange(ctx context.Context) func(*Job) error {
	return func(j *Job) error {
		if !j.Persistent || !j.State.Terminal() {
			return nil
		}
		p.mu.Lock()
		d := p.leased[dbKey{j.Server, j.DB}]
		p.mu.Unlock()
		if d == nil {
			return nil // not ours now: the owner's scan or feed handles it
		}
		if err := d.writeBack(ctx, j.DocID, j); err != nil {
			d.log.Warn().Err(err).Str("doc_id", j.DocID).Msg("writing terminal state failed")
		}
		return nil
	}
}
