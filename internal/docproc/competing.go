package docproc

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/pause"
	"github.com/couchrep/couchrep/internal/takeover"
)

// A watched server's own replicator (Apache CouchDB's) processes the same
// _replicator documents unless it was stopped, and so does another couchrep
// store watching the same server: both then copy the data and race to write
// _replication_state back. Every Options.CompetingInterval the processor
// refreshes this store's marker in the databases it follows and asks each
// watched server for the facts of internal/takeover ([replicator] max_jobs,
// _active_tasks, _scheduler/docs, other stores' markers), the same facts
// couchrepctl takeover checks, and records the verdict in a Competition
// that GET /_up and couchrepctl nodes read.

// Statuses of a server's check (ServerCheck.Status).
const (
	// CheckPending: not checked yet.
	CheckPending = "not_checked"
	// CheckNoneFound: every fact was read and none says another replicator
	// works on the server: [replicator] max_jobs = 0, no replication task,
	// no running document, no other couchrep store's marker.
	CheckNoneFound = takeover.StatusNone
	// CheckCompeting: the server's own replicator is on (ServerWide), runs
	// jobs for the documents of Databases, or another couchrep store
	// follows them (OtherStores).
	CheckCompeting = takeover.StatusCompeting
	// CheckUnknown: nothing found, but not every fact could be read
	// (Reason says which and why: a server without /_node/_local/_config,
	// such as PouchDB Server, or without admin credentials).
	CheckUnknown = takeover.StatusUnknown
)

// CompetingDB is one _replicator database the server's own replicator
// works on.
type CompetingDB struct {
	// DB is the database name ("_replicator", "other/_replicator").
	DB string `json:"db"`
	// Jobs is the number of its documents with a running or crashing job
	// on the server.
	Jobs int `json:"jobs"`
	// Since is when the check first found it.
	Since time.Time `json:"since"`
}

// ServerCheck is the latest check of one watched server.
type ServerCheck struct {
	// Server is the server's URL without credentials.
	Server string `json:"server"`
	// Status is CheckPending, CheckNoneFound, CheckCompeting or CheckUnknown.
	Status string `json:"status"`
	// Reason says what the check found, or what it could not read.
	Reason string `json:"reason,omitempty"`
	// ServerWide: the server's own replicator is on ([replicator] max_jobs
	// > 0, or replication tasks run): all its _replicator databases
	// compete.
	ServerWide bool `json:"server_wide,omitempty"`
	// OtherStores are the other couchrep stores whose marker is live in
	// the server's _replicator databases.
	OtherStores []string `json:"other_stores,omitempty"`
	// Action is what the node does about it: "warn" or "refuse".
	Action string `json:"action"`
	// Checked is when the server was last asked.
	Checked time.Time `json:"checked,omitzero"`
	// Databases are the competing databases, by name.
	Databases []CompetingDB `json:"databases,omitempty"`
	// Stopped counts the jobs of the server's _replicator documents this
	// node stopped (on_competing_replicator = refuse) since the other
	// replicator was found; zero once none is found.
	Stopped int `json:"stopped_jobs,omitempty"`
}

// Competition is what the node knows about competing replicators on its
// watched servers. It is safe for concurrent use and outlives processors
// (an actor restart keeps what was found and warned about).
type Competition struct {
	mu      sync.Mutex
	servers map[string]*ServerCheck
	changed chan struct{}
}

// NewCompetition returns an empty Competition.
func NewCompetition() *Competition {
	return &Competition{servers: map[string]*ServerCheck{}, changed: make(chan struct{})}
}

// Snapshot returns the checks of every watched server, by server URL.
func (c *Competition) Snapshot() []ServerCheck {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]ServerCheck, 0, len(c.servers))
	for _, s := range c.servers {
		cp := *s
		cp.Databases = slices.Clone(s.Databases)
		cp.OtherStores = slices.Clone(s.OtherStores)
		out = append(out, cp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Server < out[j].Server })
	return out
}

// competing reports whether the server's replicator runs jobs for db.
func (c *Competition) competing(server, db string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.servers[server]
	if s == nil {
		return false
	}
	if s.ServerWide {
		return true
	}
	for _, d := range s.Databases {
		if d.DB == db {
			return true
		}
	}
	return false
}

// changes returns a channel closed at the next change of a server's
// competing databases.
func (c *Competition) changes() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// register adds a server not checked yet.
func (c *Competition) register(server, action string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.servers[server]; s != nil {
		s.Action = action
		return
	}
	c.servers[server] = &ServerCheck{Server: server, Status: CheckPending, Action: action}
}

// change is what one check changed: databases that started and stopped
// competing, and the server's own replicator turned on or off.
type change struct {
	started, stopped    []string
	serverOn, serverOff bool
}

// record stores a check's verdict. A verdict that could read no fact at
// all (keep) keeps what was found before.
func (c *Competition) record(server string, v takeover.Verdict, keep bool, now time.Time) change {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.servers[server]
	if s == nil {
		s = &ServerCheck{Server: server}
		c.servers[server] = s
	}
	first := s.Status == CheckPending
	s.Status, s.Reason, s.Checked = v.Status, v.Reason, now
	if v.Status == CheckUnknown && keep {
		if first {
			c.notify()
		}
		return change{}
	}
	var ch change
	since := map[string]time.Time{}
	for _, d := range s.Databases {
		since[d.DB] = d.Since
	}
	var dbs []CompetingDB
	for _, db := range slices.Sorted(maps.Keys(v.Jobs)) {
		t, ok := since[db]
		if !ok {
			t = now
			ch.started = append(ch.started, db)
		}
		dbs = append(dbs, CompetingDB{DB: db, Jobs: v.Jobs[db], Since: t})
	}
	for _, d := range s.Databases {
		if _, ok := v.Jobs[d.DB]; !ok {
			ch.stopped = append(ch.stopped, d.DB)
		}
	}
	ch.serverOn, ch.serverOff = v.ServerWide && !s.ServerWide, !v.ServerWide && s.ServerWide
	s.Databases, s.ServerWide, s.OtherStores = dbs, v.ServerWide, slices.Clone(v.OtherStores)
	if !s.ServerWide && len(s.Databases) == 0 {
		s.Stopped = 0
	}
	if first || len(ch.started) > 0 || len(ch.stopped) > 0 || ch.serverOn || ch.serverOff {
		c.notify()
	}
	return ch
}

// addStopped counts n jobs of server stopped because of the competition.
func (c *Competition) addStopped(server string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.servers[server]; s != nil && n > 0 {
		s.Stopped += n
	}
}

// notify wakes those waiting on changes; c.mu is held.
func (c *Competition) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// blocked reports whether a node refusing competing databases must wait
// before following db on server: until the server's first check, and
// while its replicator runs jobs for db.
func (c *Competition) blocked(server, db string) bool {
	c.mu.Lock()
	s := c.servers[server]
	pending := s != nil && s.Status == CheckPending
	c.mu.Unlock()
	return pending || c.competing(server, db)
}

// prober asks srv for the facts of internal/takeover as this store.
func (p *Processor) prober(srv server) takeover.Prober {
	return takeover.Prober{Endpoint: srv.ep, Options: p.couchOpts(), StoreID: p.storeID, Clock: p.opts.Clock}
}

// checkServer refreshes this store's marker in the databases of srv this
// node follows, then reads the server's facts and returns the verdict, and
// whether no fact at all could be read (keep what was found before).
func (p *Processor) checkServer(ctx context.Context, srv server) (takeover.Verdict, bool) {
	pr := p.prober(srv)
	for _, db := range p.followed(srv.key) {
		if err := pr.Mark(ctx, db, p.opts.Node, p.opts.ServerUUID, p.opts.CompetingInterval); err != nil && ctx.Err() == nil {
			p.log.Debug().Str("server", srv.key).Str("db", db).Err(err).Msg("writing this store's marker failed")
		} else if err == nil {
			p.setMarked(srv.key, db)
		}
	}
	f := pr.Probe(ctx, p.knownDBs(srv.key))
	keep := !f.Replicator.Known && !f.Tasks.Known && !f.Scheduler.Known && !f.Markers.Known
	return takeover.Assess(f, p.opts.Clock()), keep
}

// setMarked records that this processor wrote its marker into db.
func (p *Processor) setMarked(server, db string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marked[dbKey{server, db}] = true
}

// unmarkTimeout bounds the removal of this store's markers when the
// processor stops.
const unmarkTimeout = 3 * time.Second

// unmark removes this store's entry from the markers this processor wrote
// on srv, as it stops: a stopped store is no competitor (another node of
// the store that still follows a database marks it again at its next
// check).
func (p *Processor) unmark(srv server) {
	p.mu.Lock()
	var dbs []string
	for k := range p.marked {
		if k.server == srv.key {
			dbs = append(dbs, k.db)
			delete(p.marked, k)
		}
	}
	p.mu.Unlock()
	if len(dbs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), unmarkTimeout)
	defer cancel()
	pr := p.prober(srv)
	for _, db := range dbs {
		if err := pr.Unmark(ctx, db); err != nil {
			p.log.Debug().Str("server", srv.key).Str("db", db).Err(err).Msg("removing this store's marker failed; it goes stale")
		}
	}
}

// followed returns the databases of server this node follows now.
func (p *Processor) followed(server string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for k := range p.leased {
		if k.server == server {
			out = append(out, k.db)
		}
	}
	sort.Strings(out)
	return out
}

// knownDBs returns server's _replicator databases as discovery last listed
// them; nil before the first listing (the probe lists them itself).
func (p *Processor) knownDBs(server string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.known[server]
}

// setKnown records discovery's latest listing of server's databases.
func (p *Processor) setKnown(server string, dbs map[string]bool) {
	list := slices.Sorted(maps.Keys(dbs))
	if list == nil {
		list = []string{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.known[server] = list
}

// watchCompetition checks server i now and then every CompetingInterval,
// until ctx ends, and logs what starts or stops competing.
func (p *Processor) watchCompetition(ctx context.Context, i int) {
	srv := p.servers[i]
	defer p.unmark(srv)
	log := p.log.With().Str("server", srv.key).Logger()
	stopIt := "stop it with [replicator] max_jobs = 0 on the server; couchrepctl takeover checks every precondition"
	for {
		v, keep := p.checkServer(ctx, srv)
		if ctx.Err() != nil {
			return
		}
		ch := p.comp.record(srv.key, v, keep, p.opts.Clock().UTC().Truncate(time.Second))
		what := "both copy the data and race to write _replication_state"
		if p.refuse() {
			what = "stopping this store's jobs of its _replicator documents and leaving them alone until it stops"
		}
		if ch.serverOn {
			log.Warn().Str("reason", v.Reason).Str("on_competing_replicator", p.opts.OnCompeting).
				Msgf("competing replicator: the server's own replicator is on and processes the same _replicator documents: %s (%s)", what, stopIt)
		}
		if ch.serverOff {
			log.Info().Msg("competing replicator stopped: the server's own replicator is off ([replicator] max_jobs = 0) and runs no replication task")
		}
		for _, db := range ch.started {
			ev := log.Warn().Str("db", db).Int("jobs", v.Jobs[db]).Str("on_competing_replicator", p.opts.OnCompeting)
			if len(v.OtherStores) > 0 {
				ev = ev.Strs("other_stores", v.OtherStores)
			}
			if p.refuse() {
				ev.Msgf("competing replicator: another replicator works on this _replicator database (%s); stopping this store's jobs of it and leaving it alone until it stops (%s)", v.Reason, stopIt)
			} else {
				ev.Msgf("competing replicator: another replicator works on this _replicator database too (%s): both copy the data and race to write _replication_state (%s)", v.Reason, stopIt)
			}
		}
		for _, db := range ch.stopped {
			log.Info().Str("db", db).Msg("competing replicator stopped: no other replicator works on this _replicator database any more")
		}
		if v.Status == CheckUnknown {
			log.Debug().Str("reason", v.Reason).Msg("competing replicator check: not every fact could be read")
		}
		if pause.For(ctx, p.opts.CompetingInterval) != nil {
			return
		}
	}
}

// refuse reports whether competing databases are left alone (and this
// store's jobs of them stopped).
func (p *Processor) refuse() bool { return p.opts.OnCompeting == "refuse" }

// waitAllowed returns once this node may follow k: at once, unless
// on_competing_replicator is refuse; then after the server's first check,
// and while its replicator runs no job for the database. Each time it
// finds the database competing, it first calls onCompeting (which stops
// the database's jobs).
func (p *Processor) waitAllowed(ctx context.Context, k dbKey, onCompeting func()) error {
	if !p.refuse() {
		return nil
	}
	stopped := false
	for {
		ch := p.comp.changes()
		if !p.comp.blocked(k.server, k.db) {
			return nil
		}
		if !stopped && p.comp.competing(k.server, k.db) {
			stopped = true
			onCompeting()
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// stopCompetingJobs stops the jobs of st's database that this store runs
// while another replicator works on it (on_competing_replicator = refuse),
// if this node holds or can take the database's lease (the node holding it
// does it otherwise): every job of its documents that has not finished is
// removed (a running one stopped now by its node), and the feed checkpoint
// forgotten, so that once the other replicator stops, following the
// database from its start adds them again (the documents' records are
// kept: a state written back stays written) and they resume from the
// checkpoints, the other replicator's included. It returns how many jobs
// it stopped.
func (p *Processor) stopCompetingJobs(ctx context.Context, srv server, st *state, log zerolog.Logger) int {
	ok, err := st.acquire(ctx, p.opts.Node, p.opts.Clock(), p.opts.LeaseTTL)
	if err != nil || !ok {
		if err != nil && ctx.Err() == nil {
			log.Warn().Err(err).Msg("taking the lease to stop the jobs of a database another replicator works on failed")
		}
		return 0
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := st.release(rctx, p.opts.Node); err != nil {
			log.Warn().Err(err).Msg("releasing lease failed")
		}
	}()
	recs, err := st.records(ctx)
	if err != nil {
		log.Warn().Err(err).Msg("reading the documents' records to stop their jobs failed")
		return 0
	}
	n := 0
	for id, rec := range recs {
		if rec.JobID == "" {
			continue
		}
		j, err := p.opts.Jobs.Get(ctx, rec.JobID)
		if errors.Is(err, ErrJobNotFound) || (err == nil && j.State.Terminal()) {
			continue
		}
		if err == nil {
			err = p.opts.Jobs.Remove(ctx, rec.JobID)
		}
		if err != nil && !errors.Is(err, ErrJobNotFound) {
			log.Warn().Err(err).Str("doc_id", id).Msg("stopping the job of a document another replicator runs failed")
			continue
		}
		n++
	}
	if err := st.forgetSeq(ctx); err != nil {
		log.Warn().Err(err).Msg("forgetting the feed checkpoint failed: documents unchanged since get their jobs back only when edited")
	}
	p.comp.addStopped(srv.key, n)
	if n == 0 {
		return 0
	}
	log.Warn().Int("jobs_stopped", n).Str("on_competing_replicator", p.opts.OnCompeting).
		Msg("competing replicator: stopped this store's jobs of this _replicator database while another replicator runs its documents; they resume from their checkpoints once it stops")
	return n
}

// stopWhenCompeting cancels a database's follower (with errCompeting) when
// the server's replicator starts running jobs for it, if this node refuses
// competing databases. It returns when ctx ends.
func (p *Processor) stopWhenCompeting(ctx context.Context, k dbKey, cancel context.CancelCauseFunc) {
	if !p.refuse() {
		return
	}
	for {
		ch := p.comp.changes()
		if p.comp.competing(k.server, k.db) {
			cancel(errCompeting)
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}
