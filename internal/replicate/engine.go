package replicate

import (
	"cmp"
	"context"
	"crypto/rand"
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

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	clog "github.com/couchrep/couchrep/internal/log"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/sharedfeed"
	"github.com/couchrep/couchrep/internal/startlimit"
	"github.com/couchrep/couchrep/internal/timerwheel"
)

// Sentinel errors a caller (the job actor) branches on; the returned error
// wraps one of them together with the underlying cause.
var (
	// ErrDBNotFound: the source or target database could not be opened
	// (CouchDB's db_not_found).
	ErrDBNotFound = errors.New("replication: db_not_found")
	// ErrUnauthorized: an endpoint rejected the credentials (401/403) at start.
	ErrUnauthorized = errors.New("replication: unauthorized")
	// ErrFilterFetch: the named filter's design document could not be read.
	ErrFilterFetch = errors.New("replication: filter_fetch_error")
	// ErrChangesFailed: reading the source's _changes failed for good.
	ErrChangesFailed = errors.New("replication: changes_req_failed")
	// ErrWorkerFailed: a _revs_diff, fetch or write failed for good.
	ErrWorkerFailed = errors.New("replication: worker_died")
	// ErrCheckpointFailed: a checkpoint could not be recorded.
	ErrCheckpointFailed = errors.New("replication: checkpoint_commit_failure")
	// ErrDocWriteFailed: the target refused a document and the
	// replication has stop_on_write_failure: the job ends (failed) with
	// the document's reason.
	ErrDocWriteFailed = errors.New("replication: doc_write_failed")
)

// connBufferSize is the read and write buffer of the connections of a
// transport the engine builds (as the node's connection_pool): an idle
// continuous replication's open feed holds 2 KiB of buffers instead of
// net/http's 8. Bulk transfers bypass them.
const connBufferSize = 1 << 10

// docBufferBytes flushes a worker's _bulk_docs buffer (CouchDB: 4 MiB).
const docBufferBytes = 4 << 20

// Options are the engine's collaborators and knobs beyond Params.
type Options struct {
	// ServerUUID is the first element of the replication id ([couchdb] uuid).
	ServerUUID string
	// Logger receives the job's structured logs.
	Logger zerolog.Logger
	// HTTPClient sends every request; nil builds one whose transport keeps
	// http_connections connections per endpoint.
	HTTPClient *http.Client
	// Limiter paces requests per (endpoint, method) on 429s; nil builds a
	// RateLimiter for this run only. A node passes its rate_limiter's, so
	// every job of the node shares one (as in CouchDB).
	Limiter couch.Limiter
	// Clock returns the current time (tests); nil is time.Now.
	Clock func() time.Time
	// OnProgress, if set, is called with fresh stats after every
	// checkpoint, and about once per ProgressInterval while they change
	// (the first time even if they did not; a run with nothing moving
	// reports nothing more): from a goroutine of the run's timer while the
	// run is under way, never concurrently, never after Run returns; and
	// once more when the run ends.
	OnProgress func(Stats)
	// OnCounted, if set, is told each increment of the run's counters
	// made by this run's own work (the workers' batches), never the
	// counters a run starts from (its checkpoint's history, Prior): what
	// this process did, for counters that must not jump on a restart. It
	// is called from the workers' goroutines, concurrently, and must
	// return quickly.
	OnCounted func(Stats)
	// Prior, if set, are the job's counters when its last run ended: a
	// run of the replication Prior.RepID starts its counters at the larger
	// of them and its checkpoint's history, so they never go backwards
	// across a restart.
	Prior *Prior
	// ProgressInterval defaults to one second.
	ProgressInterval time.Duration
	// Timers is the wheel the run's checkpoint and progress timer is on
	// (the node's, shared by all its jobs); nil is timerwheel.Default().
	Timers *timerwheel.Wheel
	// RetryBackoff is the first wait before retrying a request (doubling);
	// zero is CouchDB's 250 ms.
	RetryBackoff time.Duration
	// MissingDocRetry is the wait before asking the source again for a
	// document it answered 404 for (missing_doc_retry_msec); zero is
	// CouchDB's 2 s.
	MissingDocRetry time.Duration
	// MaxDocumentIDLength skips the changes of documents whose id is
	// longer (bytes), each counted in doc_write_failures
	// (max_document_id_length); zero is no limit.
	MaxDocumentIDLength int
	// OnEvent, if set, is told of checkpoints and changes-feed failures
	// (metrics); it must return quickly.
	OnEvent func(Event)
	// Clients, when set, gives each endpoint's HTTP client (the node's
	// connection_pool lease); it takes precedence over HTTPClient.
	Clients ClientSource
	// Endpoints are the node's [replicator] settings for connections and
	// authentication (TLS, socket options, auth plugins, error budget).
	// HTTPClient, when used, ignores its TLS and socket settings.
	Endpoints EndpointConfig
	// Principal names the replication's owner in security warnings ("in
	// database D, docid X" or "by user U"); empty: from user_ctx.
	Principal string
	// Limits bound what the endpoints may send (largest document, _changes
	// row, whole response; zero fields are couch's defaults). Their
	// ReadTimeout is ignored: every read's deadline is the job's
	// connection_timeout.
	Limits couch.Limits
	// Feeds, when set, is the node's hub of shared changes feeds: a
	// continuous replication with doc_ids or without a filter follows its
	// source's shared feed instead of holding a feed of its own
	// ([replicator] share_changes_feeds).
	Feeds *sharedfeed.Hub
	// FeedTransport, if set, wraps the transport of a shared feed's
	// connections (the node's request metrics).
	FeedTransport func(http.RoundTripper) http.RoundTripper
	// Startup, if set, admits the run's start-up: it is called with the
	// source's server (startlimit.ServerOf) before the first request and
	// waits for a slot ([replicator] startup_concurrency, the node's
	// startlimit.Limiter); the run calls the release it returns once its
	// start-up is through (the infos, the checkpoints and, for a run on
	// a shared feed, its catch-up), or when it ends.
	Startup func(ctx context.Context, server string) (release func(), err error)
	// StartupRequests, if set with Startup, admits each of the run's
	// start-up requests while it holds its start-up slot (the infos,
	// checkpoints and filter code; the catch-up of a run on a shared
	// feed) and each request of its checkpoints (_ensure_full_commit,
	// the _local writes): at most startup_concurrency in flight per
	// server (startlimit.Limiter.Request), however many requests each
	// starting job sends at once and however many jobs checkpoint
	// together (the jobs started in one second checkpoint in the same
	// tick of the timer wheel, and park together).
	StartupRequests couch.Gate
	// Infos, when set, shares the answers of GET /db and GET / among the
	// node's runs that start together (InfoShare): one read of a central
	// database's info for the jobs starting in the same second.
	Infos *InfoShare
	// Park lets a continuous run park (Params.IdleParkAfter): after that
	// long without a change, with nothing in flight and its feed working,
	// it records its checkpoint, closes its feed and returns with
	// Result.Parked set and a nil error. The caller, which can tell when
	// the source changes, waits for that and starts a new run.
	Park bool
	// FromZero starts the run from the beginning (or the job's since_seq)
	// whatever its checkpoints say (couchrepctl job reset): Stats.StartFrom
	// is StartReset. The checkpoint documents are kept; the run's
	// checkpoints are added to their history.
	FromZero bool
	// ParkLater, if set while Park is not, is asked every idle_park_after
	// of an idle continuous run (on a timer: it must not block): true lets
	// the run park as with Park (the caller's wake-up source works now: a
	// server whose _db_updates could not be read, asked again once its
	// verdict expired).
	ParkLater func() bool
}

// Result is the outcome of a one-shot run, or of a continuous run that was
// stopped.
type Result struct {
	// Body is CouchDB's POST /_replicate response for a one-shot
	// replication: {"ok":true, <checkpoint>}, {"ok":true,"no_changes":true,...}
	// or {"ok":true,"use_checkpoints":false}.
	Body json.RawMessage
	// ID is base+ext.
	ID string
	// NoChanges reports that nothing was checkpointed in this run.
	NoChanges bool
	// Stats are the final counters.
	Stats Stats
	// Parked is set when a continuous run parked (Options.Park): it
	// ended idle, checkpointed, to be started again when its source
	// changes.
	Parked *Parked
}

// Replication is one replication job's engine. Build it with New and call
// Run once.
type Replication struct {
	p   Params
	o   Options
	log zerolog.Logger
	now func() time.Time

	src, tgt *couch.DB
	ownTrs   []*http.Transport // built by openDBs; idle connections closed when Run ends
	base     string
	ext      string

	ctr      counters
	failures failureLog // the run's last documents the target refused
	fetch    fetchGate  // the workers' shared _revs_diff/_bulk_get statistics
	// inlineUntil (unix nanoseconds): until then the workers write a
	// document with attachments as JSON with their data inline, without
	// trying a multipart PUT first (one stalled or was refused).
	inlineUntil atomic.Int64
	// startedUp: the run's start-up is over, its requests pass
	// Options.StartupRequests no more.
	startedUp atomic.Bool

	// timerFired, if set, is told what each call of the run's timer
	// function found due (tests).
	timerFired func(ckpt, prog bool)
}

// New returns a replication of p. Nothing happens until Run.
func New(p Params, o Options) *Replication {
	r := &Replication{p: p, o: o, log: o.Logger, now: o.Clock}
	if r.now == nil {
		r.now = time.Now
	}
	if r.o.ProgressInterval <= 0 {
		r.o.ProgressInterval = time.Second
	}
	if r.o.MissingDocRetry <= 0 {
		r.o.MissingDocRetry = DefaultMissingDocRetry
	}
	if r.p.WorkerProcesses < 1 {
		r.p.WorkerProcesses = 1
	}
	if r.p.WorkerBatchSize < 1 {
		r.p.WorkerBatchSize = 1
	}
	if r.p.CheckpointInterval <= 0 {
		r.p.CheckpointInterval = DefaultCheckpointInterval
	}
	return r
}

func endpointOf(ep EndpointParams) (couch.Endpoint, error) {
	return couch.ParseEndpoint(ep.Object())
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// FilterFetchError is a named filter that could not be fetched from the
// source. It matches ErrFilterFetch and the cause (errors.Is).
type FilterFetchError struct {
	// Reason is CouchDB's text for it (couch_replicator_filters:fetch/3),
	// which _scheduler/docs shows, e.g. "Couldn't open document
	// `_design/f` from source database `http://h/db/`:
	// {error,<<\"not_found\">>}"; the URL has no credentials.
	Reason string
	// Err is the cause: the request's error, or nil for a design document
	// without the filter.
	Err error
}

// Error implements error.
func (e *FilterFetchError) Error() string { return ErrFilterFetch.Error() + ": " + e.Reason }

// Unwrap returns ErrFilterFetch and the cause.
func (e *FilterFetchError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrFilterFetch}
	}
	return []error{ErrFilterFetch, e.Err}
}

// FetchFilterCode reads the named filter ("ddoc/name") from the source's
// design document, as couch_replicator_filters:fetch/3 does; it fails with
// a *FilterFetchError carrying CouchDB's text. Where the design document
// cannot be read, the source database is read too (only then: CouchDB
// opens it first), to tell a missing database from a missing document.
func FetchFilterCode(ctx context.Context, src *couch.DB, filter string) (string, error) {
	ddoc, name, ok := strings.Cut(filter, "/")
	if !ok {
		return "", &FilterFetchError{Reason: fmt.Sprintf("Invalid filter %q", filter)}
	}
	uri := redact.StripUserinfo(src.String())
	raw, err := src.GetDoc(ctx, "_design/"+ddoc, nil)
	if err != nil {
		if ctx.Err() != nil {
			return "", err
		}
		if _, dbErr := src.Info(ctx); dbErr != nil && ctx.Err() == nil {
			tag := "db_not_found" // couch_replicator_api_wrap:db_open/3
			switch {
			case errors.Is(dbErr, couch.ErrUnauthorized):
				tag = "unauthorized"
			case errors.Is(dbErr, couch.ErrForbidden):
				tag = "forbidden"
			}
			return "", &FilterFetchError{Err: dbErr, Reason: fmt.Sprintf("Could not open source database `%s`: {%s,%s}", uri, tag, erlBinary(uri))}
		}
		return "", &FilterFetchError{Err: err, Reason: fmt.Sprintf("Couldn't open document `_design/%s` from source database `%s`: {error,%s}", ddoc, uri, erlBinary(errorName(err)))}
	}
	var d map[string]json.RawMessage
	missing := func(key string) error {
		return &FilterFetchError{Reason: fmt.Sprintf("Couldn't parse filter code from document %s on `%s`  Error: {not_found,%s}", ddoc, uri, erlBinary("missing json key: "+key))}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return "", missing("filters")
	}
	var filters map[string]json.RawMessage
	if f, ok := d["filters"]; !ok || string(f) == "null" {
		return "", missing("filters")
	} else if json.Unmarshal(f, &filters) != nil {
		return "", &FilterFetchError{Reason: fmt.Sprintf("Couldn't parse filter code from document %s on `%s`  Error: {not_found,json_mismatch}", ddoc, uri)}
	}
	var code string
	if f, ok := filters[name]; !ok || string(f) == "null" {
		return "", missing(name)
	} else if json.Unmarshal(f, &code) != nil {
		return "", &FilterFetchError{Reason: fmt.Sprintf("Couldn't parse filter code from document %s on `%s`  Error: badarg", ddoc, uri)}
	}
	return code, nil
}

// errorName is CouchDB's "error" of a failed request ("not_found"), else
// the error's text.
func errorName(err error) string {
	var he *couch.HTTPError
	if errors.As(err, &he) && he.ErrorName != "" {
		return he.ErrorName
	}
	return err.Error()
}

// erlBinary prints s as Erlang's ~p prints a binary: <<"s">>.
func erlBinary(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `<<"` + r.Replace(s) + `">>`
}

func (r *Replication) openDBs() error {
	srcEp, err := endpointOf(r.p.Source)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	tgtEp, err := endpointOf(r.p.Target)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	srcClient, err := r.endpointClient("source", srcEp, r.p.Source)
	if err != nil {
		return err
	}
	tgtClient, err := r.endpointClient("target", tgtEp, r.p.Target)
	if err != nil {
		return err
	}
	lim := r.o.Limiter
	if lim == nil {
		lim = NewRateLimiter(r.now)
	}
	limits := r.o.Limits
	limits.ReadTimeout = r.p.ConnectionTimeout
	opts := couch.Options{Logger: r.log, Retries: r.p.RetriesPerRequest,
		RetryBackoff: r.o.RetryBackoff, Limiter: lim, Session: r.o.sessionOptions(), Tokens: r.o.Endpoints.tokenOptions(),
		ErrorBudget: r.o.Endpoints.errorBudget(), Limits: limits, RequestTimeout: r.o.Endpoints.RequestTimeout,
		CompressMinBytes: r.o.Endpoints.compressMinBytes()}
	srcOpts, tgtOpts := opts, opts
	srcOpts.HTTPClient, tgtOpts.HTTPClient = srcClient, tgtClient
	r.src, r.tgt = couch.NewDB(srcEp, srcOpts), couch.NewDB(tgtEp, tgtOpts)
	return nil
}

func openError(which string, db *couch.DB, err error) error {
	switch {
	case errors.Is(err, couch.ErrUnauthorized), errors.Is(err, couch.ErrForbidden):
		return fmt.Errorf("%w: unauthorized to access or create database %s: %w", ErrUnauthorized, db, err)
	default:
		return fmt.Errorf("%w: could not open %s database %s: %w", ErrDBNotFound, which, db, err)
	}
}

// ID returns the replication id (base+ext) once Run has computed it.
func (r *Replication) ID() string { return r.base + r.ext }

// batch is up to worker_batch_size changes, numbered by the seq tracker.
type batch struct {
	n       uint64
	changes []couch.Change
	seq     couch.Seq
}

// Run executes the replication. A one-shot replication returns when every
// change up to the source's state at start is replicated and checkpointed;
// a continuous one runs until ctx is cancelled, then records a final
// checkpoint and returns with a nil error. Failures return a wrapped
// sentinel error with a reason a user can read.
func (r *Replication) Run(ctx context.Context) (Result, error) {
	st, err := r.prepare(ctx)
	if err != nil {
		r.closeIdle()
		return Result{}, err
	}
	res, err := st.end(ctx, st.pipeline(ctx))
	r.closeIdle()
	return res, err
}

// Start is Run on a goroutine of its own: it opens the endpoints and reads
// the checkpoints in the caller's goroutine, then replicates on a new one,
// and calls done with what Run would return, exactly once (in the caller's
// goroutine when the replication fails to start). The new goroutine starts
// with a shallow stack and keeps it while it waits on the changes feed,
// which keeps an idle continuous replication cheap (see runState.main).
func (r *Replication) Start(ctx context.Context, done func(Result, error)) {
	st, err := r.prepare(ctx)
	if err != nil {
		r.closeIdle()
		done(Result{}, err)
		return
	}
	go st.main(ctx, done)
}

// main is the goroutine of a run begun with Start. Its frame, the
// pipeline's, the changes reader's and the feed's are kept small: Go
// halves a goroutine's stack only while it uses less than a quarter of it,
// so a feed waiting under a deep stack would hold 16 KiB of stack instead
// of 8.
func (s *runState) main(ctx context.Context, done func(Result, error)) {
	err := s.pipeline(ctx)
	s.complete(ctx, err, done)
}

func (s *runState) complete(ctx context.Context, err error, done func(Result, error)) {
	res, err := s.end(ctx, err)
	s.r.closeIdle()
	done(res, err)
}

// closeIdle closes the idle connections of the transport openDBs built.
func (r *Replication) closeIdle() {
	for _, tr := range r.ownTrs {
		tr.CloseIdleConnections()
	}
}

// paced is ctx with the node's bound on the requests of a checkpoint
// (Options.StartupRequests), during the start-up and after it.
func (r *Replication) paced(ctx context.Context) context.Context {
	if r.o.Startup == nil || r.o.StartupRequests == nil {
		return ctx
	}
	return couch.WithGate(ctx, r.o.StartupRequests)
}

// gated is ctx with the run's start-up gate (Options.StartupRequests): its
// requests pass it until the start-up is over (runState.startupDone), then
// go out at once. Only the start-up's own requests are made with it (open:
// the infos, checkpoints and filter code; the catch-up of a run on a
// shared feed), never the workers': a worker streaming an attachment holds
// its GET open while it PUTs, and two admissions held at once by one
// request could wait on each other.
func (r *Replication) gated(ctx context.Context) context.Context {
	if r.o.Startup == nil || r.o.StartupRequests == nil {
		return ctx
	}
	gate := r.o.StartupRequests
	return couch.WithGate(ctx, func(c context.Context, server string) (func(), error) {
		if r.startedUp.Load() {
			return nil, nil
		}
		return gate(c, server)
	})
}

// prepare waits for a start-up slot (Options.Startup), opens the
// endpoints, computes the replication id and reads the checkpoints:
// everything before the changes feed.
func (r *Replication) prepare(ctx context.Context) (*runState, error) {
	release := func() {}
	if r.o.Startup != nil {
		rel, err := r.o.Startup(ctx, startlimit.ServerOf(r.p.Source.URL))
		if err != nil {
			return nil, err
		}
		release = sync.OnceFunc(func() {
			r.startedUp.Store(true)
			rel()
		})
	}
	st, err := r.open(r.gated(ctx))
	if err != nil {
		release()
		return nil, err
	}
	st.startedUp = release
	return st, nil
}

// open is prepare once admitted.
func (r *Replication) open(ctx context.Context) (*runState, error) {
	if err := r.openDBs(); err != nil {
		return nil, err
	}
	p := r.p
	// Start-up costs round trips, not requests (issue 25): everything goes
	// out at once — the source's info, the target's creation then info,
	// and both checkpoints, whose id depends on nothing the endpoints say
	// — except for a named filter, whose code is part of the replication
	// id: it is fetched beside the infos, the checkpoints in a second
	// round.
	var (
		srcInfo, tgtInfo     couch.DBInfo
		srcInfoSent          time.Time
		srcErr, tgtErr       error
		code                 string
		codeErr              error
		srcLog, tgtLog       storedCheckpoint
		srcLogErr, tgtLogErr error
		localID              string
		wg                   sync.WaitGroup
	)
	readCheckpoints := func() error {
		var err error
		if r.base, r.ext, err = ID(p, r.o.ServerUUID); err != nil {
			return err
		}
		r.log = clog.With(r.log, "replication_id", r.base+r.ext)
		localID = "_local/" + r.base
		wg.Go(func() { srcLog, srcLogErr = r.readCheckpoint(ctx, r.src, localID) })
		wg.Go(func() { tgtLog, tgtLogErr = r.readCheckpoint(ctx, r.tgt, localID) })
		return nil
	}
	wg.Go(func() { srcInfo, srcInfoSent, srcErr = r.o.Infos.dbInfo(ctx, p.Source, r.src) })
	wg.Go(func() {
		if tgtErr = r.createTarget(ctx); tgtErr == nil {
			tgtInfo, _, tgtErr = r.o.Infos.dbInfo(ctx, p.Target, r.tgt)
		}
	})
	needCode := p.Filter != "" && !strings.HasPrefix(p.Filter, "_") && !p.filterCodeSet
	var idErr error
	if needCode {
		wg.Go(func() { code, codeErr = FetchFilterCode(ctx, r.src, p.Filter) })
	} else {
		idErr = readCheckpoints()
	}
	wg.Wait()
	if srcErr != nil {
		return nil, openError("source", r.src, srcErr)
	}
	if tgtErr != nil {
		return nil, openError("target", r.tgt, tgtErr)
	}
	if tgtInfo.DocCount == 0 && tgtInfo.DocDelCount == 0 {
		r.fetch.emptyTarget(r.now())
	}
	if needCode {
		if codeErr != nil {
			return nil, codeErr
		}
		p = p.WithFilterCode(code)
		idErr = readCheckpoints()
		wg.Wait()
	}
	if err := cmp.Or(idErr, srcLogErr, tgtLogErr); err != nil {
		return nil, err
	}
	log := r.log
	startSeq, history, startFrom := compareCheckpointsFrom(srcLog.Checkpoint, tgtLog.Checkpoint)
	switch {
	case r.o.FromZero:
		startSeq, startFrom = nil, StartReset
		if p.SinceSeq != nil {
			startSeq = couch.SeqOf(p.SinceSeq)
		}
	case startSeq.IsZero():
		startSeq, startFrom = nil, StartZero
		if p.SinceSeq != nil {
			startSeq, startFrom = couch.SeqOf(p.SinceSeq), StartSinceSeq
		}
	}
	// The counters carry over: from the checkpoint's history, or from the
	// job's last run when it counted more (it ended after its last
	// checkpoint), as CouchDB's scheduler starts a job from max_stats of
	// both. Restored, not counted: Options.OnCounted is not told.
	var restored Stats
	if len(history) > 0 {
		h := history[0]
		restored = Stats{RevisionsChecked: h.MissingChecked, MissingRevisionsFound: h.MissingFound,
			DocsRead: h.DocsRead, DocsWritten: h.DocsWritten, DocWriteFailures: h.DocWriteFailures,
			BulkGetDocs: h.BulkGetDocs, BulkGetAttempts: h.BulkGetAttempts}
	}
	if r.o.Prior != nil && r.o.Prior.RepID == r.ID() {
		restored = maxCounters(restored, r.o.Prior.Stats)
	}
	r.ctr.add(restored)
	log.Info().Str("source", r.src.String()).Str("target", r.tgt.String()).
		Str("start_seq", seqOrZero(startSeq).String()).Str("start_from", startFrom).Bool("continuous", p.Continuous).Msg("replication: starting")

	st := &runState{
		r: r, session: newSessionID(), startTime: r.now(), startSeq: startSeq, startFrom: startFrom, committed: startSeq,
		history: history, srcRev: srcLog.Rev, tgtRev: tgtLog.Rev, srcLog: srcLog,
		srcStart: srcInfo.InstanceStartTime, tgtStart: tgtInfo.InstanceStartTime,
		sourceSeq: srcInfo.UpdateSeq, sourceRows: srcInfo.DocCount + srcInfo.DocDelCount,
		localID: localID, tracker: newSeqTracker(startSeq),
	}
	if r.parks() && !SeqPast(srcInfo.UpdateSeq, seqOrZero(startSeq)) {
		// Nothing to replicate: the source had no change after the start
		// seq when its info was read (quietParkAfter).
		st.quietAt = srcInfoSent
	}
	return st, nil
}

// createTarget creates the target database when create_target asks for
// it. It fails only when the target refuses the credentials; any other
// failure is logged and the target opened anyway.
func (r *Replication) createTarget(ctx context.Context) error {
	p := r.p
	if !p.CreateTarget {
		return nil
	}
	params := url.Values{}
	if p.CreateTargetParams != nil {
		var m map[string]any
		_ = json.Unmarshal(p.CreateTargetParams, &m)
		for k, v := range m {
			params.Set(k, queryValue(v))
		}
	}
	if err := r.tgt.Create(ctx, params); err != nil && !errors.Is(err, couch.ErrExists) {
		if errors.Is(err, couch.ErrUnauthorized) || errors.Is(err, couch.ErrForbidden) {
			return err
		}
		r.log.Warn().Err(err).Msg("replication: create_target failed; opening the target anyway")
	}
	return nil
}

func queryValue(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func (r *Replication) readCheckpoint(ctx context.Context, db *couch.DB, id string) (storedCheckpoint, error) {
	if !r.p.UseCheckpoints {
		return storedCheckpoint{}, nil
	}
	raw, err := db.GetLocal(ctx, id)
	if errors.Is(err, couch.ErrNotFound) {
		return storedCheckpoint{}, nil
	}
	if err != nil {
		return storedCheckpoint{}, fmt.Errorf("%w: reading %s on %s: %w", ErrDBNotFound, id, db, err)
	}
	c, err := parseStoredCheckpoint(raw)
	if err != nil {
		r.log.Warn().Err(err).Str("db", db.String()).Msg("replication: unreadable checkpoint ignored")
		return storedCheckpoint{}, nil
	}
	return c, nil
}

// runState is one Run's mutable state. tracker and reported are guarded by
// mu; the checkpoint state (committed, revs, lastBody) by cmu, which also
// serialises checkpoints and progress reports (goroutines of the timers
// while the pipeline runs, then Run's goroutine); committed is written
// under mu too, so that the timers' function can read it without waiting
// for a checkpoint under way.
type runState struct {
	behind             behindTracker
	r                  *Replication
	session            string
	startTime          time.Time
	startSeq           couch.Seq
	startFrom          string // StartCheckpoint, ...
	committed          couch.Seq
	history            []HistoryEntry
	srcRev, tgtRev     string
	srcLog             storedCheckpoint
	srcStart, tgtStart string
	sourceSeq          couch.Seq
	sourceRows         int64 // the source's doc_count + doc_del_count at start-up
	// quietAt, when set, is when the source's info was read that showed
	// no change after the start seq: a run that may park and found nothing
	// to replicate at start-up parks after quietParkAfter of a working
	// feed, not idle_park_after, unless it cuts a batch first (quiet).
	quietAt  time.Time
	localID  string
	lastBody json.RawMessage

	mu       sync.Mutex
	tracker  *seqTracker
	reported progressMark // what the last progress report showed
	// readSeq is the highest seq read from the feed (the last batch cut,
	// or a page's last_seq): the source's seq as far as the run knows.
	// cutSeq is the seq of the last batch cut.
	readSeq, cutSeq couch.Seq
	// srcPending is the source's own count of the changes after what the
	// run read (a _changes answer's "pending"), nil when it gave none;
	// pendingAsked is when it was last asked for one (PendingSince).
	srcPending   *int64
	pendingAsked time.Time
	noPending    bool // the source answered PendingSince without "pending"
	// tm are the run's timers once started (pokeProgress).
	tm *runTimers
	// bt is the run's batcher once the pipeline runs; park is its idle
	// state (Options.Park).
	bt   *batcher
	park parking

	cmu   sync.Mutex
	ended bool // the timers are stopped

	// startedUp gives the run's start-up slot back (Options.Startup;
	// idempotent, nil without one).
	startedUp func()
}

// startupDone ends the run's start-up: its slot goes to the next job.
func (s *runState) startupDone() {
	if s.startedUp != nil {
		s.startedUp()
	}
}

func (s *runState) through() couch.Seq {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tracker.through
}

// stats are the run's stats now. source_seq is the source's update_seq at
// the start or the highest seq read since, whichever is later, so it is
// never behind through_seq (CouchDB's tasks show the highest seq done).
// changes_pending is the source's own count where it gave one (CouchDB's
// _changes answers carry "pending"), plus, for numeric seqs, the changes cut
// into batches and not yet through; else, for numeric seqs, source_seq minus
// through_seq (PouchDB Server gives no "pending"); else unknown.
func (s *runState) stats() Stats {
	st := s.r.ctr.snapshot()
	st.WriteFailures = s.r.failures.list()
	s.mu.Lock()
	through, read, pend, cut := s.tracker.through, s.readSeq, s.srcPending, s.cutSeq
	st.CheckpointedSourceSeq = seqOrZero(s.committed)
	s.mu.Unlock()
	st.ThroughSeq = seqOrZero(through)
	st.StartFrom, st.StartSeq = s.startFrom, seqOrZero(s.startSeq)
	src := laterSeq(s.sourceSeq, read)
	if x, ok := src.Int(); src == nil || ok && numericAfter(through, x) {
		src = through
	}
	st.SourceSeq = seqOrZero(src)
	th, thOK := st.ThroughSeq.Int()
	switch {
	case pend != nil:
		n := *pend
		if c, ok := cut.Int(); ok && thOK {
			n += max(c-th, 0) // cut, not yet through
		}
		st.ChangesPending = &n
	case thOK:
		if sn, ok := st.SourceSeq.Int(); ok {
			n := max(sn-th, 0)
			st.ChangesPending = &n
		}
	}
	s.behind.note(&st, s.r.now())
	return st
}

// behindTracker tells since when a run has seen changes pending without
// its checkpoint advancing (Stats.BehindSince).
type behindTracker struct {
	mu    sync.Mutex
	since time.Time
	at    string // the checkpointed seq then
}

// note sets st.BehindSince: zero with nothing pending; else the time of
// the first report with changes pending after none, or of the last
// advance of the checkpointed sequence, whichever is later.
func (b *behindTracker) note(st *Stats, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st.ChangesPending == nil || *st.ChangesPending <= 0 {
		b.since, b.at = time.Time{}, ""
		return
	}
	if ck := st.CheckpointedSourceSeq.String(); b.since.IsZero() || ck != b.at {
		b.since, b.at = now, ck
	}
	st.BehindSince = b.since
}

// laterSeq is the later of two seqs: the greater of two numbers, else b
// when it is set (seqs are read in feed order, so the newer one is b),
// else a.
func laterSeq(a, b couch.Seq) couch.Seq {
	if b == nil {
		return a
	}
	if a == nil {
		return b
	}
	x, ok1 := a.Int()
	y, ok2 := b.Int()
	if ok1 && ok2 && x > y {
		return a
	}
	return b
}

// numericAfter reports whether seq is a number greater than n.
func numericAfter(seq couch.Seq, n int64) bool {
	y, ok := seq.Int()
	return seq != nil && ok && y > n
}

// feedRead records how a _changes answer ended: its last_seq as the seq
// read, and the source's "pending" when it gave one; a one-shot feed read
// to its end (exhausted) has nothing more pending.
func (s *runState) feedRead(end couch.FeedEnd, exhausted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if end.LastSeq != nil {
		s.readSeq = laterSeq(s.readSeq, end.LastSeq)
	}
	switch {
	case end.Pending != nil:
		s.srcPending, s.pendingAsked = end.Pending, s.r.now()
	case exhausted:
		zero := int64(0)
		s.srcPending = &zero
	}
}

// refreshPending asks the source for its pending count after through_seq
// when its seqs are not numbers and it was not asked (nor told, by a feed
// answer) for connection_timeout, as CouchDB's replicator does
// (get_pending_count/1): a continuous feed that never ends gives none. A
// source that answers without "pending" is not asked again.
func (s *runState) refreshPending(ctx context.Context) {
	r := s.r
	s.mu.Lock()
	through, asked, none := s.tracker.through, s.pendingAsked, s.noPending
	s.mu.Unlock()
	if through == nil || none {
		return
	}
	if _, numeric := through.Int(); numeric || !asked.IsZero() && r.now().Sub(asked) < r.p.ConnectionTimeout {
		return
	}
	c, cancel := context.WithTimeout(ctx, max(r.p.ConnectionTimeout, time.Second))
	defer cancel()
	n, err := r.src.PendingSince(c, through)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pendingAsked = r.now()
	switch {
	case err != nil:
		r.log.Debug().Err(err).Msg("replication: reading the source's pending count failed")
	case n == nil:
		s.noPending = true
	default:
		s.srcPending = n
	}
}

// pipeline runs the replication: this goroutine reads the changes feed
// and cuts it into batches (readChanges, batcher), workers started on
// demand process them (workerPool), and timers — not goroutines —
// checkpoint every checkpoint_interval and report progress every
// ProgressInterval. A failure anywhere aborts the pipeline with its error
// as the cause, and is returned. It returns nil when the feed is done
// (one-shot) or ctx is.
func (s *runState) pipeline(ctx context.Context) error {
	pl := &pipeline{}
	pl.ctx, pl.cancel = context.WithCancelCause(ctx)
	pool := newWorkerPool(pl.ctx, s, pl.abort)
	bt := newBatcher(s, pool.submit)
	s.mu.Lock()
	s.bt = bt
	s.mu.Unlock()
	s.park.touch()
	tm := s.startTimers(ctx, pl.abort)
	defer s.startupDone()

	err := s.readChanges(pl.ctx, bt)
	bt.close()
	pool.close()
	tm.stop()
	return pl.result(err)
}

// pipeline is the context of a run's changes reader, workers and timers;
// the first failure cancels it.
type pipeline struct {
	ctx     context.Context
	cancel  context.CancelCauseFunc
	once    sync.Once
	failure error
}

func (pl *pipeline) abort(err error) {
	pl.once.Do(func() {
		pl.failure = err
		pl.cancel(err)
	})
}

// result is the pipeline's failure, else err (the reader's); every writer
// of the failure has returned.
func (pl *pipeline) result(err error) error {
	pl.once.Do(func() {})
	pl.cancel(nil)
	if pl.failure != nil {
		return pl.failure
	}
	return err
}

// end turns the pipeline's outcome into Run's: a failure, or the final
// checkpoint and the result.
func (s *runState) end(ctx context.Context, err error) (Result, error) {
	if errors.Is(err, errParked) {
		return s.parked(ctx)
	}
	if err != nil {
		return s.fail(err)
	}
	return s.finish(ctx, ctx.Err() != nil)
}

// runTimers are a run's periodic checkpoint and progress report: one
// timer of the node's timer wheel (Options.Timers), armed for whichever is
// due next. Its function runs on the wheel's goroutine and only looks: when
// the source moved since the last checkpoint, or the stats since the last
// report, it starts a goroutine that checkpoints or reports (serialised
// with the final checkpoint by runState.cmu) and re-arms the timer after
// it; otherwise it re-arms the timer at once. An idle run so costs a few
// comparisons per interval on a goroutine shared by every run of the node,
// writes no checkpoint (as CouchDB: only when the committed seq would
// change) and reports nothing.
type runTimers struct {
	s     *runState
	ctx   context.Context
	abort func(error)
	t     *timerwheel.Timer

	// mu guards what follows; it is never held across I/O.
	mu                 sync.Mutex
	stopped            bool
	busy               bool // a run goroutine is under way; it re-arms the timer
	nextCkpt, nextProg time.Time
	// nextPark is when the run may park next (zero: it never parks).
	nextPark time.Time
	// progWait is the current wait between progress checks:
	// ProgressInterval while batches are in flight or the stats change,
	// doubling up to idleProgressFactor times it while nothing is in
	// flight and nothing changed, back to ProgressInterval when a batch is
	// cut (poke).
	progWait time.Duration
}

// idleProgressFactor bounds how far an idle run's progress checks back
// off: ProgressInterval (the job actor's one second) times 16, about the
// 15 s they were before progress was shown live.
const idleProgressFactor = 16

func (s *runState) startTimers(ctx context.Context, abort func(error)) *runTimers {
	now := time.Now()
	iv := s.r.o.ProgressInterval
	tm := &runTimers{s: s, ctx: ctx, abort: abort,
		nextCkpt: now.Add(s.r.p.CheckpointInterval), nextProg: now.Add(iv), progWait: iv}
	if s.r.parks() || s.r.parksLater() {
		tm.nextPark = now.Add(s.parkAfter())
	}
	tm.mu.Lock() // fire uses tm.t under mu
	tm.t = s.r.timers().AfterFunc(tm.wait(now), tm.fire)
	tm.mu.Unlock()
	s.mu.Lock()
	s.tm = tm
	s.mu.Unlock()
	return tm
}

// idleWait is the wait before the next progress check after one that
// found nothing to report; tm.mu is held.
func (tm *runTimers) idleWait() time.Duration {
	iv := tm.s.r.o.ProgressInterval
	if tm.s.inFlight() {
		return iv
	}
	return min(max(tm.progWait*2, iv), iv*idleProgressFactor)
}

// poke brings the next progress check to at most ProgressInterval from now
// (a batch was cut: its progress is shown within that).
func (tm *runTimers) poke() {
	iv := tm.s.r.o.ProgressInterval
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if tm.stopped || tm.progWait <= iv {
		return
	}
	tm.progWait = iv
	now := time.Now()
	if next := now.Add(iv); next.Before(tm.nextProg) {
		tm.nextProg = next
		if !tm.busy {
			tm.t.Reset(tm.wait(now))
		}
	}
}

// inFlight reports whether batches are cut and not yet through.
func (s *runState) inFlight() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tracker.low < s.tracker.next
}

// pokeProgress is timers' poke, once they are started.
func (s *runState) pokeProgress() {
	s.mu.Lock()
	tm := s.tm
	s.mu.Unlock()
	if tm != nil {
		tm.poke()
	}
}

// timers is the wheel of the run's timers.
func (r *Replication) timers() *timerwheel.Wheel {
	if r.o.Timers != nil {
		return r.o.Timers
	}
	return timerwheel.Default()
}

// wait is how long from now until the next checkpoint or report is due;
// tm.mu is held.
func (tm *runTimers) wait(now time.Time) time.Duration {
	next := tm.nextCkpt
	if tm.nextProg.Before(next) {
		next = tm.nextProg
	}
	if !tm.nextPark.IsZero() && tm.nextPark.Before(next) {
		next = tm.nextPark
	}
	return max(next.Sub(now), 0)
}

// fire is the timer's function, on the wheel's goroutine: it must not
// block.
func (tm *runTimers) fire() {
	s, r := tm.s, tm.s.r
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if tm.stopped {
		return
	}
	now := time.Now()
	var ckpt, prog bool
	if !now.Before(tm.nextCkpt) {
		if ckpt = s.moved(); !ckpt {
			tm.nextCkpt = now.Add(r.p.CheckpointInterval)
		}
	}
	if !now.Before(tm.nextProg) {
		if prog = s.changed(); !prog {
			tm.progWait = tm.idleWait()
			tm.nextProg = now.Add(tm.progWait)
		}
	}
	if h := r.timerFired; h != nil {
		h(ckpt, prog)
	}
	if !ckpt && !prog && !tm.nextPark.IsZero() && !now.Before(tm.nextPark) {
		if !r.parks() && !r.o.ParkLater() {
			// Not yet: asked again after idle_park_after.
			tm.nextPark = now.Add(r.p.IdleParkAfter)
		} else if tm.nextPark = s.parkDue(now); !now.Before(tm.nextPark) {
			// Idle for idle_park_after: the pipeline ends, and the run
			// with a final checkpoint (runState.parked).
			tm.stopped = true
			tm.abort(errParked)
			return
		}
	}
	if ckpt || prog {
		tm.busy = true
		go tm.run(ckpt, prog)
		return
	}
	tm.t.Reset(tm.wait(now))
}

// run checkpoints and reports what fire found due, then re-arms the timer
// (unless the timers were stopped or the checkpoint failed, which aborts
// the pipeline).
func (tm *runTimers) run(ckpt, prog bool) {
	s, r := tm.s, tm.s.r
	if prog {
		// A request to the source, not under cmu: the final checkpoint
		// does not wait for it.
		s.refreshPending(tm.ctx)
	}
	s.cmu.Lock()
	if s.ended {
		s.cmu.Unlock()
		return
	}
	var err error
	if ckpt {
		err = s.checkpoint(tm.ctx) // reports the stats when it recorded one
	}
	if err == nil && prog && s.changed() {
		s.progress()
	}
	s.cmu.Unlock()
	if err != nil {
		if tm.ctx.Err() == nil {
			tm.abort(err)
		}
		return
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	tm.busy = false
	if tm.stopped {
		return
	}
	now := time.Now()
	if ckpt {
		tm.nextCkpt = now.Add(r.p.CheckpointInterval)
	}
	if prog {
		tm.progWait = r.o.ProgressInterval
		tm.nextProg = now.Add(tm.progWait)
	}
	tm.t.Reset(tm.wait(now))
}

// stop takes the timer off the wheel and waits for a checkpoint or report
// under way; none runs afterwards.
func (tm *runTimers) stop() {
	tm.mu.Lock()
	tm.stopped = true
	tm.t.Stop()
	tm.mu.Unlock()
	tm.s.cmu.Lock()
	tm.s.ended = true
	tm.s.cmu.Unlock()
}

// moved reports whether through_seq is not the checkpointed seq: a
// checkpoint would record something.
func (s *runState) moved() bool {
	if !s.r.p.UseCheckpoints {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !seqOrZero(s.tracker.through).Equal(seqOrZero(s.committed))
}

// changed reports whether the stats differ from the last report (or none
// was made): the counters (which only grow), through_seq or the
// checkpointed seq.
func (s *runState) changed() bool {
	m := s.mark()
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.reported.equal(m)
}

// progressMark is what a report showed, enough to tell whether the next
// one would show anything new.
type progressMark struct {
	valid              bool
	counts             int64 // the sum of the counters
	through, committed couch.Seq
}

func (m progressMark) equal(o progressMark) bool {
	return m.valid && o.valid && m.counts == o.counts &&
		seqOrZero(m.through).Equal(seqOrZero(o.through)) && seqOrZero(m.committed).Equal(seqOrZero(o.committed))
}

// mark is the progress now.
func (s *runState) mark() progressMark {
	counts := s.r.ctr.sum()
	s.mu.Lock()
	defer s.mu.Unlock()
	return progressMark{valid: true, counts: counts, through: s.tracker.through, committed: s.committed}
}

// progress reports the stats to OnProgress; s.cmu is held, or the timers
// are stopped.
func (s *runState) progress() {
	m := s.mark()
	if f := s.r.o.OnProgress; f != nil {
		f(s.stats())
	}
	s.mu.Lock()
	s.reported = m
	s.mu.Unlock()
}

func (s *runState) fail(err error) (Result, error) {
	s.r.log.Error().Err(err).Msg("replication: crashed")
	return Result{ID: s.r.ID(), Stats: s.stats()}, err
}

// finish records the final checkpoint (with a fresh context when ctx was
// cancelled: CouchDB checkpoints on shutdown too) and builds the result.
func (s *runState) finish(ctx context.Context, stopped bool) (Result, error) {
	return s.finishAs(ctx, stopped, "finished")
}

// finishAs is finish, logged as what ("finished", "parked").
func (s *runState) finishAs(ctx context.Context, stopped bool, what string) (Result, error) {
	cctx := ctx
	if stopped {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
	}
	if err := s.checkpoint(cctx); err != nil {
		return s.fail(err)
	}
	s.progress()
	res := Result{ID: s.r.ID(), Stats: s.stats()}
	switch {
	case !s.r.p.UseCheckpoints:
		res.Body = json.RawMessage(`{"ok":true,"use_checkpoints":false}`)
	case s.lastBody == nil:
		res.NoChanges = true
		body := []byte(`{"ok":true,"no_changes":true}`)
		if s.srcLog.exists {
			var m map[string]json.RawMessage
			if json.Unmarshal(s.srcLog.Raw, &m) == nil {
				delete(m, "_id")
				delete(m, "_rev")
				b, _ := json.Marshal(m)
				if len(b) > 2 {
					body = append([]byte(`{"ok":true,"no_changes":true,`), b[1:]...)
				}
			}
		}
		res.Body = body
	default:
		res.Body = append([]byte(`{"ok":true,`), s.lastBody[1:]...)
	}
	s.r.log.Info().Bool("stopped", stopped).Int64("docs_written", res.Stats.DocsWritten).
		Int64("doc_write_failures", res.Stats.DocWriteFailures).Msg("replication: " + what)
	return res, nil
}

// checkpoint records through_seq on both endpoints (do_checkpoint/1).
func (s *runState) checkpoint(ctx context.Context) (err error) {
	r := s.r
	defer func() {
		if err != nil && ctx.Err() == nil {
			r.event(EventCheckpointFailed)
		}
	}()
	through := s.through()
	if !r.p.UseCheckpoints || seqOrZero(through).Equal(seqOrZero(s.committed)) {
		return nil
	}
	ctx = r.paced(ctx)
	c := newCheckpoint(s.session, s.startSeq, through, s.startTime, r.now(), r.ctr.snapshot(), s.history, r.p.DocIDs != nil)
	body, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCheckpointFailed, err)
	}
	// _ensure_full_commit on both sides, then the checkpoint on both sides,
	// each pair at once. Endpoints whose instance_start_time is "0"
	// (CouchDB 2 and later, PouchDB Server) cannot fail the start-time
	// check and commit every write anyway: the four requests go together,
	// one round trip.
	var srcIST, tgtIST string
	var srcErr, tgtErr error
	var wg sync.WaitGroup
	commit := func() {
		wg.Go(func() { srcIST, srcErr = r.src.EnsureFullCommit(ctx) })
		wg.Go(func() { tgtIST, tgtErr = r.tgt.EnsureFullCommit(ctx) })
	}
	var srcPutErr, tgtPutErr error
	put := func() {
		// Each side's rev is its own goroutine's: a side written keeps its
		// new rev whatever the other side did.
		wg.Go(func() {
			var rev string
			if rev, srcPutErr = s.putCheckpoint(ctx, r.src, s.srcRev, body, "source"); srcPutErr == nil {
				s.srcRev = rev
			}
		})
		wg.Go(func() {
			var rev string
			if rev, tgtPutErr = s.putCheckpoint(ctx, r.tgt, s.tgtRev, body, "target"); tgtPutErr == nil {
				s.tgtRev = rev
			}
		})
	}
	together := zeroStart(s.srcStart) && zeroStart(s.tgtStart)
	commit()
	if together {
		put()
	}
	wg.Wait()
	if err := s.checkCommit(srcIST, tgtIST, srcErr, tgtErr); err != nil {
		return err
	}
	if !together {
		put()
		wg.Wait()
	}
	if err := cmp.Or(srcPutErr, tgtPutErr); err != nil {
		return err
	}
	s.mu.Lock() // moved and mark read it under mu
	s.committed = through
	s.mu.Unlock()
	s.lastBody = body
	r.log.Debug().Str("seq", through.String()).Msg("replication: checkpoint recorded")
	r.event(EventCheckpointRecorded)
	s.progress()
	return nil
}

// zeroStart reports an instance_start_time that says nothing: "0"
// (CouchDB 2 and later) or none.
func zeroStart(ist string) bool { return ist == "0" || ist == "" }

// checkCommit checks the _ensure_full_commit answers: both succeeded and
// neither database restarted since the run began (its
// instance_start_time changed), as CouchDB's replicator checks.
func (s *runState) checkCommit(srcIST, tgtIST string, srcErr, tgtErr error) error {
	if tgtErr != nil {
		return fmt.Errorf("%w: failure on target commit: %w", ErrCheckpointFailed, tgtErr)
	}
	if srcErr != nil {
		return fmt.Errorf("%w: failure on source commit: %w", ErrCheckpointFailed, srcErr)
	}
	same := func(now, start string) bool { return now == start || zeroStart(now) || zeroStart(start) }
	switch srcOK, tgtOK := same(srcIST, s.srcStart), same(tgtIST, s.tgtStart); {
	case !srcOK && !tgtOK:
		return fmt.Errorf("%w: instance_start_time on source and target database has changed since last checkpoint", ErrCheckpointFailed)
	case !srcOK:
		return fmt.Errorf("%w: instance_start_time on source database has changed since last checkpoint", ErrCheckpointFailed)
	case !tgtOK:
		return fmt.Errorf("%w: instance_start_time on target database has changed since last checkpoint", ErrCheckpointFailed)
	}
	return nil
}

func (s *runState) putCheckpoint(ctx context.Context, db *couch.DB, rev string, body []byte, which string) (string, error) {
	newRev, err := db.PutLocal(ctx, s.localID, withRev(s.localID, rev, body))
	if errors.Is(err, couch.ErrConflict) {
		// A retried PUT that had succeeded conflicts with itself: accept it
		// when the stored body is ours.
		raw, gerr := db.GetLocal(ctx, s.localID)
		if gerr == nil {
			var stored storedCheckpoint
			if json.Unmarshal(raw, &stored) == nil && stored.SessionID == s.session &&
				stored.SourceLastSeq.Equal(s.through()) {
				return stored.Rev, nil
			}
		}
		return "", fmt.Errorf("%w: error updating the %s checkpoint document: conflict", ErrCheckpointFailed, which)
	}
	if err != nil {
		return "", fmt.Errorf("%w: error updating the %s checkpoint document: %w", ErrCheckpointFailed, which, err)
	}
	return newRev, nil
}
