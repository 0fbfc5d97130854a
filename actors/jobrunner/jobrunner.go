// Package jobrunner is the replication job actor: one per job running
// on this node, a temporary child of job_server/jobs_sup. It runs the
// replication engine (internal/replicate) under a context, never in
// Receive (a goroutine starts the job and hands it to the engine's own
// goroutine, which ends it), records progress in the job store at every
// checkpoint and at least twice per activity timeout, and ends the run in
// the store when the engine returns: completed, crashed (backoff), failed,
// or stopped cleanly (rotation, shutdown, kill). It stops at once, writing
// nothing more, when the store says the job was taken away
// (jobs.ErrWorkerConflict) or removed (jobs.ErrCanceled).
//
// The job server starts it, keeps it in its registry and stops it (a
// StopReplicationJobRequest: rotation, operator, drain); the actor knows no
// other actor by name: the connection pool and rate limiter it uses come in
// its Options. It publishes a ReplicationJobEvent on the actor system's
// event stream at every state change, and one with progress set about once
// a second while the run's stats change (LiveInterval): the node's HTTP API
// shows those live, the store gets them only every ActivityTimeout/2 and
// at checkpoints.
package jobrunner

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/connpool"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/dbupdates"
	clog "github.com/couchrep/couchrep/internal/log"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/pause"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/sharedfeed"
	"github.com/couchrep/couchrep/internal/timerwheel"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// Options are a job actor's collaborators.
type Options struct {
	// Store is the replication job store.
	Store *repjob.Store
	// Node is this node's name, recorded in the job.
	Node string
	// ServerUUID is [couchdb] uuid (replication ids).
	ServerUUID string
	// Logger receives the job's logs.
	Logger zerolog.Logger
	// StartupDelay is waited before the job does any work
	// (startup_jitter); zero starts at once.
	StartupDelay time.Duration
	// HTTPClient, if set, gives the client for the job's endpoints: the
	// hook for the node's connection_pool (nil: the engine's own pool).
	HTTPClient func(p replicate.Params) *http.Client
	// Limiter, if set, is the node's shared rate limiter (rate_limiter).
	Limiter couch.Limiter
	// Limits bound what the job's endpoints may send ([replicator]
	// max_document_bytes, max_changes_row_bytes, max_response_bytes).
	Limits couch.Limits
	// Pool, if set, is the node's connection_pool actor: the job takes its
	// HTTP client from a lease of http_connections concurrent requests per
	// endpoint, held by this actor (the pool reclaims it if the actor dies)
	// and released when the run ends. It overrides HTTPClient.
	Pool *actor.PID
	// Endpoints are the node's [replicator] settings for endpoint
	// connections and authentication (TLS, auth plugins, error budget).
	Endpoints replicate.EndpointConfig
	// JobDefaults are the options a job's document does not give, from
	// the node's [replicator] section (replicate.JobDefaults); the zero
	// value is CouchDB's defaults.
	JobDefaults replicate.Params
	// MaxDocumentIDLength and MissingDocRetry are [replicator]
	// max_document_id_length and missing_doc_retry_msec (zero: none, 2 s).
	MaxDocumentIDLength int
	MissingDocRetry     time.Duration
	// Released is called once when the actor has stopped (the job
	// server's registry).
	Released func()
	// Claim, if set, is called when the actor starts, before it touches
	// the run: false means whoever started it has given the run up (its
	// start was reported failed, and the run handed back), and the actor
	// exits at once. The job server and the actor thus never both act on
	// the run.
	Claim func() bool
	// Transport, if set, wraps the transport of the job's HTTP client (the
	// node's request metrics).
	Transport func(http.RoundTripper) http.RoundTripper
	// OnEvent, if set, is the engine's replication.Options.OnEvent.
	OnEvent func(replicate.Event)
	// OnCounted, if set, is given every increment of the job's counters
	// that its runs' own work made (replicate.Options.OnCounted), with the
	// job's id: the node's counters, which must not count the counters a
	// run starts from (its checkpoint's, CouchDB's after a takeover).
	OnCounted func(jobID string, s replicate.Stats)
	// Timers is the node's timer wheel: the engine's checkpoint and
	// progress timer and the progress heartbeat of a run without the
	// node's lease are on it; nil is timerwheel.Default().
	Timers *timerwheel.Wheel
	// Feeds, if set, is the node's hub of shared changes feeds
	// (replicate.Options.Feeds).
	Feeds *sharedfeed.Hub
	// Infos, if set, shares database and server infos among the node's
	// jobs starting together (replicate.Options.Infos).
	Infos *replicate.InfoShare
	// Startup, if set, admits the engine's start-up
	// (replicate.Options.Startup).
	Startup func(ctx context.Context, server string) (release func(), err error)
	// StartupRequests, if set, admits each request of a job in its
	// start-up and of its checkpoints (replicate.Options.StartupRequests)
	// and of a parked job's look at its source.
	StartupRequests couch.Gate
	// DBUpdates, if set, is the node's hub of _db_updates feeds
	// ([replicator] use_db_updates): a continuous job of a whole source
	// database (replicate.ParksOnDBUpdates) parks after idle_park_after
	// without a change, woken by its source server's feed. Where the
	// server's _db_updates cannot be read the job keeps its feed.
	DBUpdates *dbupdates.Hub
	// Wake, if set, opens the wake-up source of a job that may park,
	// instead of DBUpdates (tests, and sources other than _db_updates): a
	// nil Wake and a nil error mean the job does not park.
	Wake func(ctx context.Context, p replicate.Params, o replicate.Options) (park.Wake, error)
	// Rechecks paces the rechecks of the node's parked jobs (park_recheck);
	// nil: park.DefaultRate a second for this job alone.
	Rechecks *park.Rechecks
	// Hibernate, if set, takes over a parked job whose actor goes away
	// (the job server's registry; see Hibernated): false refuses it (a stop
	// is on its way) and the actor keeps the job. Nil: a parked job sleeps
	// in its actor.
	Hibernate func(h *Hibernated) bool
	// Resume, if set, is the wake-up of a hibernated job this actor was
	// respawned for.
	Resume *Resume
	// Engine overrides how the replication runs (tests, benchmarks); nil
	// runs replication.New(params, opts).Run.
	Engine func(ctx context.Context, p replicate.Params, o replicate.Options) (replicate.Result, error)
}

// StopTimeout bounds how long a stopping job actor waits for its job to
// checkpoint and go back to the queue; jobs_sup's shutdown timeout is above it.
const StopTimeout = 20 * time.Second

// Name is the child name of the actor running job jobID under jobs_sup:
// "job-" and 16 hex digits of its SHA-1 (job ids may contain "/").
func Name(jobID string) string {
	sum := sha1.Sum([]byte(jobID))
	return "job-" + hex.EncodeToString(sum[:8])
}

// Props returns the props of the actor running run.
func Props(run *repjob.Run, o Options) *actor.Props {
	// Every incarnation shares the one copy of o (the closure's).
	return actors.Props(func() actor.Actor {
		return &jobActor{run: run, o: &o, log: clog.With(o.Logger, "job_id", run.ID())}
	})
}

// outcome is what the job goroutine reports when it is done.
type outcome struct{ err error }

type jobActor struct {
	// client is the lease's client when Options.Pool is set; only the
	// job goroutine uses it.
	client  *http.Client
	run     *repjob.Run
	o       *Options // read only
	log     zerolog.Logger
	cancel  context.CancelFunc
	done    chan struct{}
	release sync.Once
	// lease is the connection pool's lease, released by exit.
	lease *connpool.Lease

	// mu guards the stop request: its reason, and, while the engine runs,
	// the cancel of its context (the job's). A request before the engine
	// starts (startup_jitter, the start's store writes) cancels the job's
	// context at once: work hands the job back to the queue.
	mu         sync.Mutex
	stopReason string
	cancelRun  context.CancelFunc
	// parkedNow: the job's record says parked (it sleeps, or is being
	// looked at after a wake-up), not running an engine.
	parkedNow atomic.Bool
}

func (a *jobActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		if a.o.Claim != nil && !a.o.Claim() {
			a.log.Info().Msg("replication job: the start was given up; exiting without touching the run")
			supervisor.Exit(ctx, nil)
			return
		}
		a.done = make(chan struct{})
		c, cancel := context.WithCancel(context.Background())
		a.cancel = cancel
		self, system := ctx.Self(), ctx.ActorSystem()
		go func() {
			if err := a.work(c, system, self); err != errHandedOff {
				a.exit(system, self, err)
			}
		}()
	case *messages.StopReplicationJobRequest:
		a.mu.Lock()
		if a.stopReason == "" {
			a.stopReason = m.GetReason()
			if a.stopReason == "" {
				a.stopReason = "stopped"
			}
		}
		if a.cancelRun != nil {
			a.cancelRun()
		} else if a.cancel != nil {
			// Not replicating yet (startup_jitter, starting): end the wait
			// or the start now. work hands the job back, as on a shutdown,
			// without marking it started.
			a.cancel()
		}
		a.mu.Unlock()
		if ctx.Sender() != nil {
			ctx.Respond(&messages.StopReplicationJobResponse{JobId: a.run.ID()})
		}
	case outcome:
		if m.err != nil {
			a.log.Warn().Err(m.err).Msg("replication job: store write failed")
		}
		supervisor.Exit(ctx, nil)
	case *actor.Stopping:
		if a.cancel != nil {
			// The goroutine stops the job cleanly (final checkpoint, back to
			// the queue). Wait for it, bounded, so that a node shutting down
			// hands its jobs back instead of leaving them to the activity
			// monitor; a kill does not wait past StopTimeout either.
			a.cancel()
			t := time.NewTimer(StopTimeout)
			select {
			case <-a.done:
			case <-t.C:
				a.log.Warn().Dur("timeout", StopTimeout).Msg("replication job: not stopped in time; finishing in the background")
			}
			t.Stop()
		}
	case *actor.Stopped:
		a.release.Do(func() {
			if a.o.Released != nil {
				a.o.Released()
			}
		})
	}
}

// work starts the job and, once the engine runs, hands it over to the
// engine's goroutine (errHandedOff); otherwise it records how the job
// ended and returns only store errors that could not be recorded.
func (a *jobActor) work(ctx context.Context, system *actor.ActorSystem, self *actor.PID) error {
	if a.o.Resume != nil {
		return a.wakeUp(ctx, system, self, a.o.Resume)
	}
	run := a.run
	if a.o.StartupDelay > 0 && pause.For(ctx, a.o.StartupDelay) != nil {
		return a.handBack(system, false)
	}
	// A job whose record says parked (another node's, or this node's
	// before a restart) goes straight to sleep when it can park here.
	accepted := run.Record()
	adopt := a.o.Hibernate != nil && accepted.GetParkedSince() != nil && accepted.GetContinuous()
	start := run.Start
	if adopt {
		start = run.StartParked
	}
	if err := start(ctx, a.o.Node); err != nil {
		if repjob.IsLost(err) {
			return nil
		}
		if ctx.Err() != nil {
			// Stopped while starting: hand the job back now rather than
			// leave it to the activity monitor.
			return a.handBack(system, false)
		}
		return err
	}
	rec := run.Record()
	a.publish(system, rec, repjob.StateRunning, "", nil)

	p, err := a.params(rec.Body)
	if err != nil {
		return a.fail(system, err.Error())
	}
	if adopt {
		if handled, err := a.adopt(ctx, system, p); handled {
			return err
		}
		if err := run.Park(ctx, time.Time{}, replicate.Stats{}); err != nil && !repjob.IsLost(err) && ctx.Err() == nil {
			a.log.Warn().Err(err).Msg("replication job: recording it no longer parked failed")
		}
	}
	if err := a.acquireLease(ctx, system, self, p); err != nil {
		if ctx.Err() != nil {
			return a.handBack(system, true)
		}
		return a.crash(system, "connection_pool: "+err.Error())
	}
	p, err = a.withFilterCode(ctx, p)
	if err != nil {
		if ctx.Err() != nil {
			return a.handBack(system, true)
		}
		var fe *replicate.FilterFetchError
		switch {
		case errors.As(err, &fe) && rec.GetKind() == messages.ReplicationKind_REPLICATION_KIND_PERSISTENT:
			// As CouchDB's doc processor: a document whose filter cannot
			// be fetched yet is a temporary error (_scheduler/docs
			// "error", CouchDB's text), retried with backoff, never
			// written to the document: it runs once the filter exists.
			return a.crash(system, fe.Reason)
		case errors.Is(err, replicate.ErrFilterFetch) && errors.Is(err, couch.ErrNotFound):
			return a.fail(system, err.Error())
		}
		return a.crash(system, err.Error())
	}
	base, ext, err := replicate.ID(p, a.o.ServerUUID)
	if err != nil {
		return a.fail(system, err.Error())
	}
	changed, err := run.ClaimRepID(ctx, base, ext, p.FilterCode)
	var dup *repjob.Duplicate
	switch {
	case errors.As(err, &dup):
		if dup.OwnerKind == messages.ReplicationKind_REPLICATION_KIND_PERSISTENT {
			return a.fail(system, dup.Error())
		}
		return a.crash(system, dup.Error())
	case err != nil:
		if repjob.IsLost(err) {
			return nil
		}
		if ctx.Err() != nil {
			return a.handBack(system, true)
		}
		return a.crash(system, err.Error())
	}
	if changed {
		a.log.Info().Str("replication_id", base+ext).Msg("replication job: replication id changed (filter code or server uuid), recorded")
	}
	return a.replicate(ctx, system, self, p, nil)
}

// params parses the job's replication body with the node's defaults.
func (a *jobActor) params(body []byte) (replicate.Params, error) {
	defaults := a.o.JobDefaults
	if defaults.WorkerProcesses == 0 {
		defaults = replicate.DefaultParams()
	}
	return replicate.ParseParamsWith(body, defaults)
}

// acquireLease takes the job's HTTP clients from the node's connection
// pool (Options.Pool), once.
func (a *jobActor) acquireLease(ctx context.Context, system *actor.ActorSystem, self *actor.PID, p replicate.Params) error {
	if a.o.Pool == nil || a.lease != nil {
		return nil
	}
	lease, err := connpool.At(system, a.o.Pool).Acquire(ctx, self, p.HTTPConnections)
	if err != nil {
		return err
	}
	a.lease = lease
	a.client = lease.Client()
	return nil
}

// handBack ends a run stopped before its engine ran (a stop request, a
// drain, a shutdown: the job's context was canceled) as the engine's end
// would: back to the queue, due now (a canceled job is lost: nothing is
// written). started says the job was marked started, and its running event
// published: a pending event with the stop's reason follows it.
func (a *jobActor) handBack(system *actor.ActorSystem, started bool) error {
	run := a.run
	a.mu.Lock()
	reason := a.stopReason
	a.mu.Unlock()
	if reason == "" {
		reason = "shutdown"
	}
	if err := a.finalWrite(func(c context.Context) error { return a.stopRun(c, reason) }); err != nil || !started {
		return err
	}
	rec := run.Record()
	a.publish(system, rec, repjob.StatePending, reason, rec.Stats)
	return nil
}

// errHandedOff: work handed the job over to the engine's goroutine, which
// calls exit when the run ends.
var errHandedOff = errors.New("jobrunner: handed off to the engine")

// exit ends the job's work, once, on whichever goroutine finished it: it
// releases the connection pool's lease and tells the actor (err is a store
// write that failed).
func (a *jobActor) exit(system *actor.ActorSystem, self *actor.PID, err error) {
	if err != nil {
		// The run could not be ended in the store: the node's lease must
		// not keep it running (jobs.Job.Abandon).
		a.run.Abandon()
	}
	if a.lease != nil {
		a.lease.Release()
	}
	close(a.done)
	system.Root.Send(self, outcome{err: err})
}

// withFilterCode fetches a named filter's code from the source, so that the
// replication id reflects the filter as it is now.
func (a *jobActor) withFilterCode(ctx context.Context, p replicate.Params) (replicate.Params, error) {
	if p.Filter == "" || strings.HasPrefix(p.Filter, "_") {
		return p, nil
	}
	raw, err := json.Marshal(p.Source.Object())
	if err != nil {
		return p, err
	}
	ep, err := couch.ParseEndpoint(json.RawMessage(raw))
	if err != nil {
		return p, fmt.Errorf("%w: source: %w", replicate.ErrInvalidParams, err)
	}
	client := a.httpClient(p)
	if a.lease != nil {
		to, err := replicate.TransportOptions(p, p.Source, a.o.Endpoints)
		if err != nil {
			return p, fmt.Errorf("%w: source: %w", replicate.ErrDBNotFound, err)
		}
		if client, err = (leaseClients{a}).ClientFor(ep.URL, to); err != nil {
			return p, fmt.Errorf("%w: source %s: %w", replicate.ErrDBNotFound, ep, err)
		}
	}
	code, err := replicate.FetchFilterCode(ctx, couch.NewDB(ep, a.o.Endpoints.CouchOptions(a.log, p.RetriesPerRequest, client)), p.Filter)
	if err != nil {
		return p, err
	}
	return p.WithFilterCode(code), nil
}

// httpClient is the client for the job's requests: the connection pool's
// lease, else Options.HTTPClient, else nil (the engine's own).
func (a *jobActor) httpClient(p replicate.Params) *http.Client {
	c := a.client
	if c == nil && a.o.HTTPClient != nil {
		c = a.o.HTTPClient(p)
	}
	if c == nil || a.o.Transport == nil {
		return c
	}
	wrapped := *c
	wrapped.Transport = a.o.Transport(c.Transport)
	return &wrapped
}

// leaseClients gives the engine each endpoint's client from the job's
// lease (a transport per endpoint, proxy and TLS settings), its transport
// wrapped by Options.Transport (the node's request metrics).
type leaseClients struct{ a *jobActor }

// ClientFor implements replication.ClientSource.
func (s leaseClients) ClientFor(u *url.URL, o couch.TransportOptions) (*http.Client, error) {
	c, err := s.a.lease.ClientFor(u, o)
	if err != nil || s.a.o.Transport == nil {
		return c, err
	}
	c.Transport = s.a.o.Transport(c.Transport)
	return c, nil
}

// replicate starts the engine and hands the job over to it (it returns
// errHandedOff): the engine replicates on a goroutine of its own, with a
// shallow stack, and records the outcome there when it ends. Progress is
// written from the engine's OnProgress (its timers) and, while the engine
// reports none, by a heartbeat timer. So an idle continuous job holds one
// goroutine of its own: the engine's, waiting on the changes feed.
func (a *jobActor) replicate(ctx context.Context, system *actor.ActorSystem, self *actor.PID, p replicate.Params, pk *parker) error {
	every := a.o.Store.ActivityTimeout() / 2
	// The engine runs under the job's context: a stop request cancels it
	// too (after recording its reason), so does losing the job.
	runCtx, cancelRun := ctx, a.cancel
	pw := newProgressWriter(ctx, a.run, a.log, every, cancelRun, a.o.Timers)
	// The engine reports about once a second while its stats change: each
	// report is published at once (the node's API shows it live) and
	// written to the store at most once per every (and at checkpoints).
	// The progress events name the job: its identity is all they keep of
	// the record (not its body, history and stats: a job lives for long,
	// mostly idle or parked).
	full := a.run.Record()
	rec := &messages.ReplicationJob{JobId: full.JobId, RepId: full.RepId, Kind: full.Kind, DbName: full.DbName,
		DocId: full.DocId, User: full.User, Continuous: full.Continuous, LastStarted: full.LastStarted}
	id := a.run.ID()
	onProgress := func(s replicate.Stats) {
		pw.write(s)
		a.publishProgress(system, rec, s)
	}
	o := a.engineOptions(p)
	o.OnProgress = onProgress
	if a.o.OnCounted != nil {
		o.OnCounted = func(s replicate.Stats) { a.o.OnCounted(id, s) }
	}
	if st := full.GetStats(); st != nil && full.GetRepId() != "" {
		// The counters of the job's last run (written when it ended): the
		// next run's never go below them.
		o.Prior = &replicate.Prior{RepID: full.GetRepId(), Stats: replicate.Stats{
			RevisionsChecked: st.GetRevisionsChecked(), MissingRevisionsFound: st.GetMissingRevisionsFound(),
			DocsRead: st.GetDocsRead(), DocsWritten: st.GetDocsWritten(), DocWriteFailures: st.GetDocWriteFailures(),
			BulkGetDocs: st.GetBulkGetDocs(), BulkGetAttempts: st.GetBulkGetAttempts()}}
	}
	a.mu.Lock()
	a.cancelRun = cancelRun
	if a.stopReason != "" {
		cancelRun()
	}
	a.mu.Unlock()

	continuous := p.Continuous
	if pk != nil {
		// A woken job's parker, its wake-up source open: the runs share
		// this p and o.
		pk.mu.Lock()
		pk.p, pk.o = &p, &o
		pk.mu.Unlock()
	} else {
		pk = a.parking(runCtx, &p, &o, nil)
	}
	if pk != nil && a.o.Hibernate != nil {
		// A run that parks hands the job to the registry: the progress
		// writer stops first (the registry watches the lease after it),
		// then the actor exits without touching the run.
		pk.hibernate = func(seq couch.Seq) bool {
			if pw.stop() {
				return false // lost: the job's context is canceled
			}
			h := &Hibernated{Run: a.run, Wake: pk.take(), Recheck: park.Jitter(p.ParkRecheck), Period: p.ParkRecheck,
				Seq: replicate.CompactSeq(seq)}
			if !a.hibernate(system, h) {
				pk.give(h.Wake)
				return false
			}
			a.mu.Lock()
			a.cancelRun = nil
			a.mu.Unlock()
			a.log.Debug().Msg("replication job: hibernated")
			a.exit(system, self, nil)
			return true
		}
	}
	var start func()
	var done func(res replicate.Result, err error)
	done = func(res replicate.Result, err error) {
		if err == nil && res.Parked != nil {
			a.mu.Lock()
			stopping := a.stopReason != ""
			a.mu.Unlock()
			if !stopping && runCtx.Err() == nil {
				// The engine's goroutine ends here; one of the job's own
				// waits while it is parked.
				go pk.wait(runCtx, res, start, done)
				return
			}
			res.Parked = nil // stopped as it parked: it ends as a stop
		}
		a.mu.Lock()
		a.cancelRun = nil
		stopped := a.stopReason
		a.mu.Unlock()
		pk.close()
		if pw.stop() {
			a.exit(system, self, nil) // the job was taken away: nothing more to write
			return
		}
		if stopped == "" && ctx.Err() != nil {
			stopped = "shutdown"
		}
		err = a.ended(system, continuous, res, err, stopped)
		cancelRun()
		a.exit(system, self, err)
	}
	start = func() {
		// A reset job's runs start from 0 until one of them checkpoints
		// (repjob clears reset_at then).
		o.FromZero = a.run.Record().GetResetAt() != nil
		if pk != nil {
			o.Park = pk.enabled()
			o.ParkLater = nil
			if !o.Park {
				o.ParkLater = pk.parkLater(runCtx)
			}
		}
		if a.o.Engine != nil {
			done(a.o.Engine(runCtx, p, o))
			return
		}
		replicate.New(p, o).Start(runCtx, done)
	}
	start()
	return errHandedOff
}

// engineOptions are the engine's options for a run of p (without its
// progress hook): the node's settings, the job's clients.
func (a *jobActor) engineOptions(p replicate.Params) replicate.Options {
	o := replicate.Options{ServerUUID: a.o.ServerUUID, Logger: a.log, ProgressInterval: LiveInterval, Limiter: a.o.Limiter,
		OnEvent: a.o.OnEvent, Limits: a.o.Limits, Timers: a.o.Timers,
		MaxDocumentIDLength: a.o.MaxDocumentIDLength, MissingDocRetry: a.o.MissingDocRetry}
	o.HTTPClient = a.httpClient(p)
	o.Endpoints = a.o.Endpoints
	o.Feeds, o.FeedTransport = a.o.Feeds, a.o.Transport
	o.Startup = a.o.Startup
	o.StartupRequests = a.o.StartupRequests
	o.Infos = a.o.Infos
	if a.lease != nil {
		o.Clients = leaseClients{a}
	}
	if m := a.run.Record(); m.GetDbName() != "" {
		o.Principal = "in database " + m.GetDbName() + ", docid " + m.GetDocId()
	} else if m.GetUser() != "" {
		o.Principal = "by user " + m.GetUser()
	}
	return o
}

// progressWriteTimeout bounds one progress write.
const progressWriteTimeout = 30 * time.Second

// LiveInterval is how often a running job reports its stats while they
// change: published on the node's event stream each time (the HTTP API of
// the node shows them), written to the store only every ActivityTimeout/2
// and at checkpoints.
const LiveInterval = time.Second

// progressWriter records a running job's progress in the store. A run held
// under the node's lease (repjob.Store.KeepLease, the usual case) writes
// only when the engine reports stats that changed: the lease proves it
// alive, so an idle job writes nothing; the lease also tells it when a
// user canceled or removed the job (kick: a write then finds the job gone
// and stops the engine) and when the lease was lost (the job was taken
// away). A run without a lease writes every report of the engine and the
// last one again when the engine has reported nothing for a while (at
// least twice per activity timeout, also while the engine is still
// starting). Writes are serialised; a write that finds the job taken away
// stops the engine.
type progressWriter struct {
	ctx       context.Context
	run       *repjob.Run
	log       zerolog.Logger
	every     time.Duration
	cancelRun context.CancelFunc

	mu      sync.Mutex
	last    replicate.Stats
	written *messages.ReplicationStats // last written (leased runs)
	stopped bool
	lost    bool
	beat    *timerwheel.Timer // runs without a lease
	timers  *timerwheel.Wheel
	// retry writes the last report again after a failed write (leased
	// runs: the engine reports only changes).
	retry     *timerwheel.Timer
	stopWatch func()
	// lastWrite is when the stats were last written; a report within
	// every of it, unless it records a checkpoint, is held (dirty) and
	// written by flush at lastWrite+every, or when the writer stops.
	lastWrite time.Time
	dirty     bool
	flushT    *timerwheel.Timer
}

func newProgressWriter(ctx context.Context, run *repjob.Run, log zerolog.Logger, every time.Duration,
	cancelRun context.CancelFunc, timers *timerwheel.Wheel) *progressWriter {
	if timers == nil {
		timers = timerwheel.Default()
	}
	w := &progressWriter{ctx: ctx, run: run, log: log, every: every, cancelRun: cancelRun, timers: timers}
	w.mu.Lock()
	defer w.mu.Unlock()
	stop, leased := run.Watch(w.kick, w.leaseLost)
	w.stopWatch = stop
	if !leased {
		// The wheel's goroutine must not wait for the store.
		w.beat = timers.AfterFunc(every, func() { go w.heartbeat() })
	}
	return w
}

// write records s (the engine's OnProgress, about once a second while the
// stats change): at once when it records a new checkpoint or nothing was
// written for every, else at most every after the last write (flush).
func (w *progressWriter) write(s replicate.Stats) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = s
	st := repjob.StatsProto(s)
	if w.written != nil && proto.Equal(st, w.written) {
		w.dirty = false
		return // nothing moved; the lease or the heartbeat proves the job alive
	}
	checkpoint := w.written != nil && st.GetCheckpointedSourceSeq() != w.written.GetCheckpointedSourceSeq()
	if since := time.Since(w.lastWrite); !checkpoint && !w.lastWrite.IsZero() && since < w.every {
		w.dirty = true
		if w.flushT == nil {
			w.flushT = w.timers.AfterFunc(w.every-since, func() { go w.flush() })
		} else {
			w.flushT.Reset(w.every - since)
		}
		return
	}
	w.written = st
	w.writeLocked()
}

// flush writes a report that write held back.
func (w *progressWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dirty {
		w.written = repjob.StatsProto(w.last)
		w.writeLocked()
	}
}

func (w *progressWriter) heartbeat() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.written = repjob.StatsProto(w.last)
	w.writeLocked()
}

// kick: a user canceled or removed the job; the write finds out.
func (w *progressWriter) kick() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writeLocked()
}

// leaseLost: the node's lease expired, its jobs were re-enqueued.
func (w *progressWriter) leaseLost() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || w.lost {
		return
	}
	w.log.Info().Msg("replication job: the node's lease was lost, stopping")
	w.lost = true
	w.cancelRun()
}

func (w *progressWriter) writeLocked() {
	if w.stopped || w.lost {
		return
	}
	if w.beat != nil {
		w.beat.Reset(w.every)
	}
	w.lastWrite, w.dirty = time.Now(), false
	// The job's context is cancelled by a stop request before the engine
	// has reported its last stats: write them anyway, bounded.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), progressWriteTimeout)
	err := w.run.Progress(ctx, w.last)
	cancel()
	switch {
	case err == nil:
	case repjob.IsLost(err):
		w.log.Info().Err(err).Msg("replication job: lost the job, stopping")
		w.lost = true
		w.cancelRun()
	default:
		w.written = nil // try again at the next report
		w.log.Warn().Err(err).Msg("replication job: progress update failed")
		if w.beat == nil {
			// Leased: the engine reports only changes, which may not come;
			// the last report is written again after every.
			if w.retry == nil {
				w.retry = w.timers.AfterFunc(w.every, func() { go w.heartbeat() })
			} else {
				w.retry.Reset(w.every)
			}
		}
	}
}

// stop ends the writes, waiting for one under way, and reports whether the
// job was lost.
func (w *progressWriter) stop() (lost bool) {
	w.mu.Lock()
	if w.dirty {
		// The last report (the engine's final one) was held back: write
		// it before the run is ended in the store.
		w.written = repjob.StatsProto(w.last)
		w.writeLocked()
	}
	w.stopped = true
	if w.beat != nil {
		w.beat.Stop()
	}
	if w.retry != nil {
		w.retry.Stop()
	}
	if w.flushT != nil {
		w.flushT.Stop()
	}
	lost = w.lost
	w.mu.Unlock()
	w.stopWatch() // outside mu: a callback may be waiting for it
	return lost
}

// ended records how the engine's run ended: completed, stopped (back to
// the queue), failed or crashed.
func (a *jobActor) ended(system *actor.ActorSystem, continuous bool, res replicate.Result, err error, stopped string) error {
	run := a.run
	switch {
	case err == nil && stopped == "" && !continuous:
		werr := a.finalWrite(func(c context.Context) error { return run.Complete(c, res) })
		if werr == nil {
			rec := run.Record()
			a.publish(system, rec, repjob.StateCompleted, "", rec.Stats)
		}
		return werr
	case stopped != "" && (err == nil || errors.Is(err, context.Canceled)):
		if err := a.finalWrite(func(c context.Context) error { return a.stopRun(c, stopped) }); err != nil {
			return err
		}
		rec := run.Record()
		a.publish(system, rec, repjob.StatePending, stopped, StatsOr(rec.Stats, res.Stats))
		return nil
	case err == nil:
		// A continuous replication never ends by itself.
		return a.crash(system, "replication ended unexpectedly")
	case errors.Is(err, replicate.ErrInvalidParams), errors.Is(err, replicate.ErrDocWriteFailed):
		// ErrDocWriteFailed: stop_on_write_failure, the document's reason.
		return a.fail(system, err.Error())
	default:
		return a.crash(system, err.Error())
	}
}

// stopRun hands the job back to the queue after a stop for reason: a job
// parked now stays parked in its record after a drain or a shutdown
// (repjob.Run.StopParked), so that the node taking it next puts it
// straight to sleep.
func (a *jobActor) stopRun(ctx context.Context, reason string) error {
	return stopFor(a.run, reason, a.parkedNow.Load())(ctx)
}

// StatsOr returns s, or st converted when s is nil.
func StatsOr(s *messages.ReplicationStats, st replicate.Stats) *messages.ReplicationStats {
	if s != nil {
		return s
	}
	return repjob.StatsProto(st)
}

func (a *jobActor) crash(system *actor.ActorSystem, reason string) error {
	var until time.Time
	err := a.finalWrite(func(c context.Context) (err error) {
		until, err = a.run.Crash(c, reason)
		return err
	})
	if err == nil {
		a.log.Warn().Str("reason", reason).Time("retry_at", until).Msg("replication job: crashed")
		a.publish(system, a.run.Record(), repjob.StateCrashing, reason, nil)
	}
	return err
}

func (a *jobActor) fail(system *actor.ActorSystem, reason string) error {
	err := a.finalWrite(func(c context.Context) error { return a.run.Fail(c, reason) })
	if err == nil {
		a.log.Warn().Str("reason", reason).Msg("replication job: failed")
		a.publish(system, a.run.Record(), repjob.StateFailed, reason, nil)
	}
	return err
}

// finalWrite records the end of the run even when the actor is stopping:
// under its own deadline, not the run's context. Losing the job is not an
// error.
func (a *jobActor) finalWrite(fn func(ctx context.Context) error) error {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fn(c); err != nil && !repjob.IsLost(err) {
		return err
	}
	return nil
}

// publishProgress publishes a progress report of the running job (a
// ReplicationJobEvent with progress set).
func (a *jobActor) publishProgress(system *actor.ActorSystem, rec *messages.ReplicationJob, s replicate.Stats) {
	system.EventStream.Publish(&messages.ReplicationJobEvent{
		JobId: rec.JobId, RepId: rec.RepId, Kind: rec.Kind, DbName: rec.DbName, DocId: rec.DocId,
		State: repjob.StateRunning.Proto(), Stats: repjob.StatsProto(s), Node: a.o.Node, Timestamp: timestamppb.Now(),
		Progress: true, Continuous: rec.Continuous, StartedAt: rec.LastStarted,
	})
}

func (a *jobActor) publish(system *actor.ActorSystem, rec *messages.ReplicationJob, st repjob.State,
	reason string, stats *messages.ReplicationStats) {
	publishEvent(system, a.o.Node, rec, st, reason, stats)
}

func publishEvent(system *actor.ActorSystem, node string, rec *messages.ReplicationJob, st repjob.State,
	reason string, stats *messages.ReplicationStats) {
	system.EventStream.Publish(&messages.ReplicationJobEvent{
		JobId: rec.JobId, RepId: rec.RepId, Kind: rec.Kind, DbName: rec.DbName, DocId: rec.DocId, State: st.Proto(),
		Reason: reason, Stats: stats, Node: node, Timestamp: timestamppb.Now(), Continuous: rec.Continuous,
		StartedAt: rec.LastStarted,
	})
}
