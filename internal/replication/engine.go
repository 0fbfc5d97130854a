package replication

import (
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
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
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
)

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
	// OnProgress, if set, is called with fresh stats about once per
	// ProgressInterval and after every checkpoint, from Run's goroutine.
	OnProgress func(Stats)
	// ProgressInterval defaults to one second.
	ProgressInterval time.Duration
	// RetryBackoff is the first wait before retrying a request (doubling);
	// zero is CouchDB's 250 ms.
	RetryBackoff time.Duration
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
}

// Replication is one replication job's engine. Build it with New and call
// Run once.
type Replication struct {
	p   Params
	o   Options
	log zerolog.Logger
	now func() time.Time

	src, tgt *couch.DB
	ownTr    *http.Transport // built by openDBs; idle connections closed when Run ends
	base     string
	ext      string

	ctr   counters
	fetch fetchGate // the workers' shared _revs_diff/_bulk_get statistics
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
	m := map[string]any{"url": ep.URL}
	if len(ep.Headers) > 0 {
		h := map[string]any{}
		for _, x := range ep.Headers {
			h[x.Name] = x.Value
		}
		m["headers"] = h
	}
	if ep.HasBasic {
		m["auth"] = map[string]any{"basic": map[string]any{"username": ep.BasicUser, "password": ep.BasicPass}}
	}
	return couch.ParseEndpoint(m)
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// FetchFilterCode reads the named filter ("ddoc/name") from the source's
// design document, as couch_replicator_filters:fetch/3 does.
func FetchFilterCode(ctx context.Context, src *couch.DB, filter string) (string, error) {
	ddoc, name, ok := strings.Cut(filter, "/")
	if !ok {
		return "", fmt.Errorf("%w: invalid filter %q", ErrFilterFetch, filter)
	}
	raw, err := src.GetDoc(ctx, "_design/"+ddoc, nil)
	if err != nil {
		return "", fmt.Errorf("%w: couldn't open document `_design/%s` from source database `%s`: %w", ErrFilterFetch, ddoc, src, err)
	}
	var d struct {
		Filters map[string]json.RawMessage `json:"filters"`
	}
	var code string
	if err := json.Unmarshal(raw, &d); err != nil || json.Unmarshal(d.Filters[name], &code) != nil {
		return "", fmt.Errorf("%w: couldn't parse filter code `%s` from document _design/%s on `%s`", ErrFilterFetch, name, ddoc, src)
	}
	return code, nil
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
	client := r.o.HTTPClient
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = max(r.p.HTTPConnections, 2) * 2
		tr.MaxConnsPerHost = max(r.p.HTTPConnections, 2) * 2
		client = &http.Client{Transport: tr, Timeout: 0}
		r.ownTr = tr
	}
	lim := r.o.Limiter
	if lim == nil {
		lim = NewRateLimiter(r.now)
	}
	opts := couch.Options{HTTPClient: client, Logger: r.log, Retries: r.p.RetriesPerRequest,
		RetryBackoff: r.o.RetryBackoff, Limiter: lim}
	r.src, r.tgt = couch.NewDB(srcEp, opts), couch.NewDB(tgtEp, opts)
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

// batch is worker_batch_size changes (or a seq-only marker: no changes).
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
	if err := r.openDBs(); err != nil {
		return Result{}, err
	}
	if r.ownTr != nil {
		defer r.ownTr.CloseIdleConnections()
	}
	p := r.p
	if p.CreateTarget {
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
				return Result{}, openError("target", r.tgt, err)
			}
			r.log.Warn().Err(err).Msg("replication: create_target failed; opening the target anyway")
		}
	}
	srcInfo, err := r.src.Info(ctx)
	if err != nil {
		return Result{}, openError("source", r.src, err)
	}
	tgtInfo, err := r.tgt.Info(ctx)
	if err != nil {
		return Result{}, openError("target", r.tgt, err)
	}
	if tgtInfo.DocCount == 0 && tgtInfo.DocDelCount == 0 {
		r.fetch.emptyTarget(r.now())
	}
	if p.Filter != "" && !strings.HasPrefix(p.Filter, "_") && !p.filterCodeSet {
		code, err := FetchFilterCode(ctx, r.src, p.Filter)
		if err != nil {
			return Result{}, err
		}
		p = p.WithFilterCode(code)
	}
	if r.base, r.ext, err = ID(p, r.o.ServerUUID); err != nil {
		return Result{}, err
	}
	log := r.log.With().Str("replication_id", r.base+r.ext).Logger()
	r.log = log
	localID := "_local/" + r.base

	srcLog, err := r.readCheckpoint(ctx, r.src, localID)
	if err != nil {
		return Result{}, err
	}
	tgtLog, err := r.readCheckpoint(ctx, r.tgt, localID)
	if err != nil {
		return Result{}, err
	}
	startSeq, history := compareCheckpoints(srcLog.Checkpoint, tgtLog.Checkpoint)
	if startSeq.IsZero() {
		startSeq = nil
		if p.SinceSeq != nil {
			startSeq = couch.SeqOf(p.SinceSeq)
		}
	}
	if len(history) > 0 {
		h := history[0]
		r.ctr.add(Stats{RevisionsChecked: h.MissingChecked, MissingRevisionsFound: h.MissingFound,
			DocsRead: h.DocsRead, DocsWritten: h.DocsWritten, DocWriteFailures: h.DocWriteFailures,
			BulkGetDocs: h.BulkGetDocs, BulkGetAttempts: h.BulkGetAttempts})
	}
	log.Info().Str("source", r.src.String()).Str("target", r.tgt.String()).
		Str("start_seq", seqOrZero(startSeq).String()).Bool("continuous", p.Continuous).Msg("replication: starting")

	st := &runState{
		r: r, session: newSessionID(), startTime: r.now(), startSeq: startSeq, committed: startSeq,
		history: history, srcRev: srcLog.Rev, tgtRev: tgtLog.Rev, srcLog: srcLog,
		srcStart: srcInfo.InstanceStartTime, tgtStart: tgtInfo.InstanceStartTime,
		sourceSeq: srcInfo.UpdateSeq, localID: localID, tracker: newSeqTracker(startSeq),
	}
	return st.run(ctx)
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

// runState is one Run's mutable state, owned by Run's goroutine except
// tracker (guarded by mu).
type runState struct {
	r                  *Replication
	session            string
	startTime          time.Time
	startSeq           couch.Seq
	committed          couch.Seq
	history            []HistoryEntry
	srcRev, tgtRev     string
	srcLog             storedCheckpoint
	srcStart, tgtStart string
	sourceSeq          couch.Seq
	localID            string
	lastBody           json.RawMessage

	mu      sync.Mutex
	tracker *seqTracker
}

func (s *runState) through() couch.Seq {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tracker.through
}

func (s *runState) stats() Stats {
	st := s.r.ctr.snapshot()
	st.ThroughSeq = seqOrZero(s.through())
	st.CheckpointedSourceSeq = seqOrZero(s.committed)
	st.SourceSeq = seqOrZero(s.sourceSeq)
	if src, ok := s.sourceSeq.Int(); ok {
		if th, ok := st.ThroughSeq.Int(); ok {
			pending := max(src-th, 0)
			st.ChangesPending = &pending
		}
	}
	return st
}

func (s *runState) run(ctx context.Context) (Result, error) {
	r := s.r
	pctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)

	batches := make(chan batch, r.p.WorkerProcesses)
	done := make(chan uint64, r.p.WorkerProcesses*2)
	errc := make(chan error, r.p.WorkerProcesses+2)
	readerDone := make(chan struct{})
	var wg sync.WaitGroup

	go func() {
		defer close(readerDone)
		defer close(batches)
		if err := s.readChanges(pctx, batches); err != nil && pctx.Err() == nil {
			errc <- err
		}
	}()
	for i := 0; i < r.p.WorkerProcesses; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &worker{r: r}
			for b := range batches {
				if len(b.changes) > 0 {
					if err := w.process(pctx, b.changes); err != nil {
						if pctx.Err() == nil {
							errc <- err
						}
						return
					}
				}
				select {
				case done <- b.n:
				case <-pctx.Done():
					return
				}
			}
		}()
	}
	workersDone := make(chan struct{})
	go func() { wg.Wait(); close(workersDone) }()

	stop := func() {
		cancel(context.Canceled)
		<-readerDone
		<-workersDone
	}
	ckpt := time.NewTicker(r.p.CheckpointInterval)
	defer ckpt.Stop()
	prog := time.NewTicker(r.o.ProgressInterval)
	defer prog.Stop()
	for {
		select {
		case n := <-done:
			s.mu.Lock()
			s.tracker.finish(n)
			s.mu.Unlock()
		case <-workersDone:
			// Drain completions that raced with the close.
			for {
				select {
				case n := <-done:
					s.mu.Lock()
					s.tracker.finish(n)
					s.mu.Unlock()
					continue
				default:
				}
				break
			}
			select {
			case err := <-errc:
				stop()
				return s.fail(err)
			default:
			}
			if ctx.Err() != nil {
				return s.finish(ctx, true)
			}
			return s.finish(ctx, false)
		case err := <-errc:
			stop()
			return s.fail(err)
		case <-ckpt.C:
			if err := s.checkpoint(ctx); err != nil {
				stop()
				return s.fail(err)
			}
		case <-prog.C:
			s.progress()
		case <-ctx.Done():
			stop()
			// Completed batches may still sit in done.
			for {
				select {
				case n := <-done:
					s.mu.Lock()
					s.tracker.finish(n)
					s.mu.Unlock()
					continue
				default:
				}
				break
			}
			return s.finish(ctx, true)
		}
	}
}

func (s *runState) progress() {
	if f := s.r.o.OnProgress; f != nil {
		f(s.stats())
	}
}

func (s *runState) fail(err error) (Result, error) {
	s.r.log.Error().Err(err).Msg("replication: crashed")
	return Result{ID: s.r.ID(), Stats: s.stats()}, err
}

// finish records the final checkpoint (with a fresh context when ctx was
// cancelled: CouchDB checkpoints on shutdown too) and builds the result.
func (s *runState) finish(ctx context.Context, stopped bool) (Result, error) {
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
		Int64("doc_write_failures", res.Stats.DocWriteFailures).Msg("replication: finished")
	return res, nil
}

// checkpoint records through_seq on both endpoints (do_checkpoint/1).
func (s *runState) checkpoint(ctx context.Context) error {
	r := s.r
	through := s.through()
	if !r.p.UseCheckpoints || seqOrZero(through).Equal(seqOrZero(s.committed)) {
		return nil
	}
	type res struct {
		ist string
		err error
	}
	srcCh := make(chan res, 1)
	go func() {
		ist, err := r.src.EnsureFullCommit(ctx)
		srcCh <- res{ist, err}
	}()
	tgtIST, terr := r.tgt.EnsureFullCommit(ctx)
	sr := <-srcCh
	if terr != nil {
		return fmt.Errorf("%w: failure on target commit: %w", ErrCheckpointFailed, terr)
	}
	if sr.err != nil {
		return fmt.Errorf("%w: failure on source commit: %w", ErrCheckpointFailed, sr.err)
	}
	same := func(now, start string) bool {
		return now == start || now == "0" || start == "0" || now == "" || start == ""
	}
	switch srcOK, tgtOK := same(sr.ist, s.srcStart), same(tgtIST, s.tgtStart); {
	case !srcOK && !tgtOK:
		return fmt.Errorf("%w: instance_start_time on source and target database has changed since last checkpoint", ErrCheckpointFailed)
	case !srcOK:
		return fmt.Errorf("%w: instance_start_time on source database has changed since last checkpoint", ErrCheckpointFailed)
	case !tgtOK:
		return fmt.Errorf("%w: instance_start_time on target database has changed since last checkpoint", ErrCheckpointFailed)
	}
	c := newCheckpoint(s.session, s.startSeq, through, s.startTime, r.now(), r.ctr.snapshot(), s.history, r.p.DocIDs != nil)
	body, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCheckpointFailed, err)
	}
	if s.srcRev, err = s.putCheckpoint(ctx, r.src, s.srcRev, body, "source"); err != nil {
		return err
	}
	if s.tgtRev, err = s.putCheckpoint(ctx, r.tgt, s.tgtRev, body, "target"); err != nil {
		return err
	}
	s.committed, s.lastBody = through, body
	r.log.Debug().Str("seq", through.String()).Msg("replication: checkpoint recorded")
	s.progress()
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
