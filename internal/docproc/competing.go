package docproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/pause"
)

// A watched server's own replicator (Apache CouchDB's) processes the same
// _replicator documents unless it was stopped: both then copy the data and
// race to write _replication_state back. The processor asks each watched
// server's scheduler (GET /_scheduler/docs) which documents it runs jobs
// for, every Options.CompetingInterval, and records what it found in a
// Competition that GET /_up and couchrepctl nodes read.

// Statuses of a server's check (ServerCheck.Status).
const (
	// CheckPending: not checked yet.
	CheckPending = "not_checked"
	// CheckNoneFound: the server runs no replication job for a
	// _replicator document, or has no _scheduler (PouchDB Server, CouchDB
	// 1.x): no competing replicator.
	CheckNoneFound = "none_found"
	// CheckCompeting: the server runs jobs for the documents of Databases.
	CheckCompeting = "competing"
	// CheckUnknown: the check failed (Reason says why; e.g. the server
	// requires admin credentials for _scheduler/docs).
	CheckUnknown = "unknown"
)

// competingStates are the _scheduler/docs states of a document whose job
// the server runs or will retry. "pending" is not among them: with
// [replicator] max_jobs = 0 (the way to stop CouchDB 3.x's replicator)
// every document stays pending and nothing runs.
var competingStates = []string{"running", "crashing", "error"}

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
	// Reason explains a none_found without _scheduler, or an unknown.
	Reason string `json:"reason,omitempty"`
	// Action is what the node does about it: "warn" or "refuse".
	Action string `json:"action"`
	// Checked is when the server was last asked.
	Checked time.Time `json:"checked,omitzero"`
	// Databases are the competing databases, by name.
	Databases []CompetingDB `json:"databases,omitempty"`
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

// record stores a check's result: jobs per competing database (nil when
// none), or the status and reason of a check that found none or failed.
// A failed check keeps the databases found before. It returns the
// databases that started and stopped competing.
func (c *Competition) record(server, status, reason string, jobs map[string]int, now time.Time) (started, stopped []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.servers[server]
	if s == nil {
		s = &ServerCheck{Server: server}
		c.servers[server] = s
	}
	first := s.Status == CheckPending
	s.Status, s.Reason, s.Checked = status, reason, now
	if status == CheckUnknown {
		if first {
			c.notify()
		}
		return nil, nil
	}
	since := map[string]time.Time{}
	for _, d := range s.Databases {
		since[d.DB] = d.Since
	}
	var dbs []CompetingDB
	for _, db := range slices.Sorted(maps.Keys(jobs)) {
		t, ok := since[db]
		if !ok {
			t = now
			started = append(started, db)
		}
		dbs = append(dbs, CompetingDB{DB: db, Jobs: jobs[db], Since: t})
	}
	for _, d := range s.Databases {
		if _, ok := jobs[d.DB]; !ok {
			stopped = append(stopped, d.DB)
		}
	}
	s.Databases = dbs
	if first || len(started) > 0 || len(stopped) > 0 {
		c.notify()
	}
	return started, stopped
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

// schedulerDocs is the part of GET /_scheduler/docs the check reads.
type schedulerDocs struct {
	Docs []struct {
		Database string `json:"database"`
		DocID    string `json:"doc_id"`
		State    string `json:"state"`
	} `json:"docs"`
}

// checkServer asks srv's scheduler which _replicator documents it runs
// jobs for: status CheckCompeting with the job count per database,
// CheckNoneFound (with a reason when the server has no _scheduler), or
// CheckUnknown with the reason.
func (p *Processor) checkServer(ctx context.Context, srv server) (status, reason string, jobs map[string]int) {
	// GET <server>/_scheduler/docs, the "/" unescaped (a document id
	// "_scheduler/docs" would be sent as _scheduler%2Fdocs, a database).
	sched := couch.NewDB(srv.dbEndpoint("_scheduler"), p.couchOpts())
	q := url.Values{"states": {"running,crashing"}, "limit": {"10000"}}
	raw, err := sched.GetDoc(ctx, "docs", q)
	var he *couch.HTTPError
	switch {
	case errors.As(err, &he) && (he.Status == http.StatusUnauthorized || he.Status == http.StatusForbidden):
		return CheckUnknown, fmt.Sprintf("GET /_scheduler/docs answered %d: watch the server with server-admin credentials", he.Status), nil
	case errors.As(err, &he) && he.Status >= 400 && he.Status < 500, errors.As(err, &he) && he.Status == http.StatusNotImplemented:
		return CheckNoneFound, fmt.Sprintf("GET /_scheduler/docs answered %d: no replication scheduler", he.Status), nil
	case err != nil:
		return CheckUnknown, err.Error(), nil
	}
	var sd schedulerDocs
	if err := json.Unmarshal(raw, &sd); err != nil {
		return CheckNoneFound, "GET /_scheduler/docs is not a scheduler's answer: no replication scheduler", nil
	}
	for _, d := range sd.Docs {
		if d.Database == "" || !IsReplicatorDB(d.Database) || !slices.Contains(competingStates, d.State) {
			continue
		}
		if jobs == nil {
			jobs = map[string]int{}
		}
		jobs[d.Database]++
	}
	if len(jobs) > 0 {
		return CheckCompeting, "", jobs
	}
	return CheckNoneFound, "", nil
}

// watchCompetition checks server i now and then every CompetingInterval,
// until ctx ends, and logs each database that starts or stops competing.
func (p *Processor) watchCompetition(ctx context.Context, i int) {
	srv := p.servers[i]
	log := p.log.With().Str("server", srv.key).Logger()
	for {
		status, reason, jobs := p.checkServer(ctx, srv)
		if ctx.Err() != nil {
			return
		}
		started, stopped := p.comp.record(srv.key, status, reason, jobs, p.opts.Clock().UTC().Truncate(time.Second))
		for _, db := range started {
			ev := log.Warn().Str("db", db).Int("jobs", jobs[db]).Str("on_competing_replicator", p.opts.OnCompeting)
			if p.refuse() {
				ev.Msg("competing replicator: the server's own replicator runs jobs for documents of this _replicator database; leaving it alone until it stops (stop it with [replicator] max_jobs = 0 on the server)")
			} else {
				ev.Msg("competing replicator: the server's own replicator runs jobs for documents of this _replicator database too: both copy the data and race to write _replication_state (stop it with [replicator] max_jobs = 0 on the server)")
			}
		}
		for _, db := range stopped {
			log.Info().Str("db", db).Msg("competing replicator stopped: the server's own replicator runs no job for this _replicator database any more")
		}
		if status == CheckUnknown {
			log.Debug().Str("reason", reason).Msg("competing replicator check failed")
		}
		if pause.For(ctx, p.opts.CompetingInterval) != nil {
			return
		}
	}
}

// refuse reports whether competing databases are left alone.
func (p *Processor) refuse() bool { return p.opts.OnCompeting == "refuse" }

// waitAllowed returns once this node may follow k: at once, unless
// on_competing_replicator is refuse; then after the server's first check,
// and while its replicator runs no job for the database.
func (p *Processor) waitAllowed(ctx context.Context, k dbKey) error {
	if !p.refuse() {
		return nil
	}
	for {
		ch := p.comp.changes()
		if !p.comp.blocked(k.server, k.db) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
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
