package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
)

// replicate is POST /_replicate.
func (s *Server) replicate(w http.ResponseWriter, r *http.Request, _ string) error {
	body, err := s.readJSONBody(w, r)
	if err != nil {
		return err
	}
	req, err := replicate.ParseReplicateRequest(body)
	if err == nil && req.HasEndpoints {
		err = req.Params.CheckCredentials(s.credCommands)
	}
	if err != nil {
		return paramError(err)
	}
	ctx, user := r.Context(), userOf(r.Context())
	if req.Cancel {
		return s.cancel(w, r, req, body, user)
	}
	added, err := s.store.AddTransient(ctx, body, user, userCtxOf(ctx).IsAdmin())
	if errors.Is(err, ErrOtherUser) {
		// couch_replicator:check_authorization: another user's job runs
		// this replication id.
		return errorf(http.StatusUnauthorized, "unauthorized", "You are not a server admin.")
	}
	if err != nil {
		return err
	}
	jobID := added.JobID
	if req.Params.Continuous {
		// 202 at once, as CouchDB does; only a replication whose id needs
		// the source's filter code waits until the job computed it.
		started := func(j *Job) bool { return j.RepID != "" || j.State.Terminal() || j.State == repjob.StateCrashing }
		job := added
		if !started(job) {
			if job, err = s.store.Wait(ctx, jobID, started); err != nil {
				return err
			}
		}
		if job.RepID == "" {
			return startError(job)
		}
		writeJSON(w, http.StatusAccepted, map[string]any{"ok": true, "_local_id": job.RepID})
		return nil
	}
	// A one-shot replication answers when it completes, or with the error
	// of its first crash; as in CouchDB, a transient job that crashed is
	// then removed rather than retried behind the caller's back.
	job, err := s.store.Wait(ctx, jobID, func(j *Job) bool { return j.State.Terminal() || j.State == repjob.StateCrashing || j.Paused() })
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return errorf(http.StatusNotFound, "not_found", "replication %s was cancelled", jobID)
		}
		return err
	}
	if job.Paused() && !job.State.Terminal() {
		// couchrep's own: an operator paused the job (couchrepctl job
		// pause); waiting would last until someone resumes it.
		return errorf(http.StatusConflict, "conflict", "replication %s is paused: `couchrepctl job resume %s` runs it again", jobID, jobID)
	}
	if job.State != repjob.StateCompleted {
		if job.State == repjob.StateCrashing {
			if err := s.store.Remove(ctx, job.JobID); err != nil && !errors.Is(err, ErrNotFound) {
				s.log.Warn().Err(errors.New(redact.Text(err.Error()))).Str("job_id", job.JobID).Msg("remove crashed one-shot job")
			}
		}
		return startError(job)
	}
	res := job.Result
	if len(res) == 0 || !json.Valid(res) {
		res = json.RawMessage(`{"ok":true}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "must-revalidate")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(append([]byte(nil), res...), '\n'))
	return nil
}

// startError is the reply for a replication that failed: CouchDB's
// db_not_found / unauthorized where the reason says so.
func startError(j *Job) *apiError {
	reason := j.LastError
	if reason == "" {
		reason = "replication " + j.State.String()
	}
	switch {
	case strings.Contains(reason, "db_not_found"):
		// CouchDB's documentation says 404; its code answers 500.
		return errorf(http.StatusNotFound, "db_not_found", "%s", reason)
	case strings.Contains(reason, "unauthorized"):
		return errorf(http.StatusUnauthorized, "unauthorized", "%s", reason)
	}
	return errorf(http.StatusInternalServerError, "error", "%s", reason)
}

// cancelNotFound is CouchDB's answer to the cancel of a replication that
// does not exist (couch_replicator_httpd: 404 {"error":"not found"}, no
// reason): it names no id, so it shows no internal job id either.
func cancelNotFound() *apiError {
	return &apiError{status: http.StatusNotFound, code: "not found", reason: "replication not found", bare: true}
}

// cancel stops a transient replication named by ID or by its body.
func (s *Server) cancel(w http.ResponseWriter, r *http.Request, req replicate.ReplicateRequest, body []byte, user string) error {
	ctx := r.Context()
	var (
		job *Job
		err error
		id  = req.ID
	)
	if id != "" {
		job, err = s.findJob(r, id)
	} else {
		if id, err = s.store.TransientJobID(body, user); err != nil {
			return paramError(err)
		}
		job, err = s.store.Get(ctx, id)
		if errors.Is(err, ErrNotFound) {
			job, err = s.sameReplication(ctx, req, err)
		}
	}
	if errors.Is(err, ErrNotFound) {
		return cancelNotFound()
	}
	if err != nil {
		return err
	}
	if aerr := mayControl(userCtxOf(ctx), job); aerr != nil {
		return aerr
	}
	if !job.Transient {
		return errorf(http.StatusUnauthorized, "unauthorized", "Persistent replication collision: %s belongs to document %s in %s", id, job.DocID, job.Database)
	}
	if err := s.store.Remove(ctx, job.JobID); err != nil {
		if errors.Is(err, ErrNotFound) {
			return cancelNotFound()
		}
		return err
	}
	localID := job.RepID
	if localID == "" {
		localID = job.JobID
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "_local_id": localID})
	return nil
}

// findJob looks a job up by replication id, then by job id.
func (s *Server) findJob(r *http.Request, id string) (*Job, error) {
	job, err := s.store.FindByRepID(r.Context(), id)
	if errors.Is(err, ErrNotFound) {
		job, err = s.store.Get(r.Context(), id)
	}
	return job, err
}

// paging is _all_docs-style limit and skip.
type paging struct{ limit, skip int }

func parsePaging(q url.Values) (paging, error) {
	p := paging{limit: -1}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"limit", &p.limit}, {"skip", &p.skip}} {
		v := q.Get(f.name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return p, errorf(http.StatusBadRequest, "query_parse_error", "Invalid value for integer: %q", v)
		}
		if n < 0 {
			return p, errorf(http.StatusBadRequest, "query_parse_error", "Invalid value for positive integer: %q", v)
		}
		*f.dst = n
	}
	return p, nil
}

func (p paging) apply(n int) (lo, hi int) {
	lo = min(p.skip, n)
	hi = n
	if p.limit >= 0 {
		hi = min(lo+p.limit, n)
	}
	return lo, hi
}

// shownID is the id _scheduler shows: the replication id once known.
func shownID(j *Job) string {
	if j.RepID != "" {
		return j.RepID
	}
	return j.JobID
}

// schedulerJobs is GET /_scheduler/jobs[/{id}].
func (s *Server) schedulerJobs(w http.ResponseWriter, r *http.Request, rest string) error {
	if rest != "" {
		id, err := url.PathUnescape(rest)
		if err != nil {
			return errorf(http.StatusBadRequest, "bad_request", "invalid job id %q", rest)
		}
		job, err := s.findJob(r, strings.ReplaceAll(id, " ", "+"))
		if errors.Is(err, ErrNotFound) {
			return errorf(http.StatusNotFound, "not_found", "unknown job %s", id)
		}
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, jobView(job))
		return nil
	}
	pg, err := parsePaging(r.URL.Query())
	if err != nil {
		return err
	}
	// CouchDB sorts the jobs by id and pages with skip and limit; the
	// store reads only the page.
	page, total, err := s.store.SchedulerJobs(r.Context(), pg.skip, pg.limit)
	if err != nil {
		return err
	}
	out := make([]jobJSON, 0, len(page))
	for _, j := range page {
		out = append(out, jobView(j))
	}
	writeJSON(w, http.StatusOK, map[string]any{"total_rows": total, "offset": min(pg.skip, total), "jobs": out})
	return nil
}

// jobJSON is a _scheduler/jobs entry (couch_replicator_httpd_util job_ejson)
// plus the job's state and store id.
type jobJSON struct {
	ID        string              `json:"id"`
	JobID     string              `json:"job_id"`
	PID       *string             `json:"pid"`
	Source    string              `json:"source"`
	Target    string              `json:"target"`
	Server    *string             `json:"server"`
	Database  *string             `json:"database"`
	User      *string             `json:"user"`
	DocID     *string             `json:"doc_id"`
	State     repjob.State        `json:"state"`
	Info      map[string]any      `json:"info"`
	History   schedpolicy.History `json:"history"`
	Node      *string             `json:"node"`
	StartTime *string             `json:"start_time"`
	// SourceProxy and TargetProxy are the proxies, password masked
	// (CouchDB's job_proxy_url); null for none.
	SourceProxy *string `json:"source_proxy"`
	TargetProxy *string `json:"target_proxy"`
	// WriteFailures are the last documents the target refused (couchrep's
	// own field; absent when none).
	WriteFailures []failureJSON `json:"write_failures,omitempty"`
}

// failureJSON is one document the target refused to write, as the target
// gave it (reason redacted).
type failureJSON struct {
	ID     string  `json:"id"`
	Rev    string  `json:"rev"`
	Status int32   `json:"status"`
	Error  string  `json:"error"`
	Reason string  `json:"reason"`
	At     *string `json:"at"`
}

// writeFailures are the job's refused documents, newest last; nil if none.
func writeFailures(j *Job) []failureJSON {
	fs := j.Stats.GetWriteFailures()
	if len(fs) == 0 {
		return nil
	}
	out := make([]failureJSON, len(fs))
	for i, f := range fs {
		out[i] = failureJSON{ID: f.GetId(), Rev: f.GetRev(), Status: f.GetStatus(), Error: redact.Text(f.GetError()),
			Reason: redact.Text(f.GetReason()), At: timeOrNil(goTime(f.GetAt()))}
	}
	return out
}

// Paused reports whether an operator paused the job.
func (j *Job) Paused() bool { return !j.PausedAt.IsZero() }

// Lag is how long the job has made no progress while changes are pending
// (repjob.Lag): 0 when caught up, unknown, paused or finished.
func (j *Job) Lag(now time.Time) time.Duration {
	if j.Paused() || j.State.Terminal() || j.Stats.GetChangesPending() <= 0 || j.Stats.GetBehindSince() == nil {
		return 0
	}
	return max(now.Sub(j.Stats.GetBehindSince().AsTime()), 0)
}

func strOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func timeOrNil(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := schedpolicy.ISO8601(t)
	return &s
}

func jobView(j *Job) jobJSON {
	v := jobJSON{
		ID: shownID(j), JobID: j.JobID,
		Source: redact.URL(j.Source), Target: redact.URL(j.Target),
		User: strOrNil(j.User), State: j.State, History: j.History,
		Node: strOrNil(j.Node), StartTime: timeOrNil(j.CreatedAt),
		SourceProxy: strOrNil(redact.URL(j.SourceProxy)), TargetProxy: strOrNil(redact.URL(j.TargetProxy)),
	}
	if !j.Transient {
		v.Server, v.Database, v.DocID = strOrNil(j.Server), strOrNil(j.Database), strOrNil(j.DocID)
	}
	if j.State == repjob.StateRunning {
		v.PID = strOrNil("<" + j.JobID + "@" + j.Node + ">")
	}
	if v.History == nil {
		v.History = schedpolicy.History{}
	}
	v.Info = infoJSON(j)
	v.WriteFailures = writeFailures(j)
	if (j.State == repjob.StateCrashing || j.State == repjob.StateFailed) && j.LastError != "" {
		if v.Info == nil {
			v.Info = map[string]any{}
		}
		v.Info["error"] = redact.Text(j.LastError)
	}
	return v
}

// seqEncode shows a stored sequence as CouchDB's seq_encode: a JSON string
// as is, anything else JSON-encoded into a string.
func seqEncode(s string) json.RawMessage {
	t := strings.TrimSpace(s)
	switch {
	case t == "":
		return json.RawMessage(`"0"`)
	case t[0] == '"' && json.Valid([]byte(t)):
		return json.RawMessage(t)
	}
	b, _ := json.Marshal(t)
	return b
}

// statsJSON is a job's stats as _scheduler/jobs "info" and _active_tasks
// show them: an unknown changes_pending is null, sequences are
// seq_encode'd ("0" when unknown); nil for no stats.
func statsJSON(st *messages.ReplicationStats) map[string]any {
	if st == nil {
		return nil
	}
	m := map[string]any{}
	for _, s := range repjob.Stats(st) {
		switch {
		case s.Kind == repjob.StatSeq:
			m[s.Key] = seqEncode(s.Text)
		case s.Kind == repjob.StatText:
			m[s.Key] = s.Text
		case s.Known:
			m[s.Key] = s.Int
		default:
			m[s.Key] = nil
		}
	}
	return m
}

// infoJSON is a job's "info" in _scheduler/jobs and _scheduler/docs, as
// CouchDB's job_summary: a running job's stats, all zero until its first
// report (CouchDB's job has them once it started); null for a job that
// never ran.
//
// A parked job (running, idle, its feed closed until its source changes)
// has "parked": true and "parked_since" (ISO 8601) besides its stats.
//
// couchrep adds "paused": true and "paused_since" to a paused job's info
// (a paused job is otherwise shown as CouchDB shows a job its scheduler
// stopped: pending, "stopped" newest in its history), and "lag_seconds" to
// a job behind its source without progress (Job.Lag).
func infoJSON(j *Job) map[string]any {
	if j.Stats == nil && j.State == repjob.StateRunning {
		return withOwn(j, statsJSON(&messages.ReplicationStats{}))
	}
	return withOwn(j, statsJSON(j.Stats))
}

// withOwn adds couchrep's own fields to a job's info m: parked, paused,
// lag.
func withOwn(j *Job, m map[string]any) map[string]any {
	m = withParked(j, m)
	if !j.Paused() && j.Lag(time.Now()) <= 0 {
		return m
	}
	if m == nil {
		m = map[string]any{}
	}
	if j.Paused() {
		m["paused"] = true
		m["paused_since"] = schedpolicy.ISO8601(j.PausedAt)
	}
	if l := j.Lag(time.Now()); l > 0 {
		m["lag_seconds"] = int64(l.Seconds())
	}
	return m
}

// Parked reports whether the job is running parked.
func (j *Job) Parked() bool { return j.State == repjob.StateRunning && !j.ParkedSince.IsZero() }

// withParked adds a parked job's "parked" and "parked_since" to m.
func withParked(j *Job, m map[string]any) map[string]any {
	if !j.Parked() {
		return m
	}
	if m == nil {
		m = map[string]any{}
	}
	m["parked"] = true
	m["parked_since"] = schedpolicy.ISO8601(j.ParkedSince)
	return m
}

// foldedStates are CouchDB 2.x/3.x states _scheduler/docs accepts as a
// filter (its ?REPLICATION_STATES) that no couchrep job has: initializing
// is folded into pending, so it matches nothing.
var foldedStates = []string{"initializing"}

// stateError is CouchDB's "error" of _scheduler/docs: a document that could
// not become a replication yet (its named filter could not be fetched; see
// docState).
const stateError = "error"

// docStates are the names _scheduler/docs filters on, in CouchDB's order.
var docStates = func() []string {
	names := append(slices.Clone(foldedStates), stateError)
	for _, st := range repjob.States {
		names = append(names, st.String())
	}
	return names
}()

// docState is the state _scheduler/docs shows for j: the job's, except
// that a persistent job crashing before it has a replication id (a named
// filter's code could not be fetched from the source) is CouchDB's
// "error": its doc processor keeps such a document out of the scheduler,
// retrying with backoff (repjob.Record.NotScheduled: _scheduler/jobs does
// not list it).
func docState(j *Job) string {
	if !j.Transient && j.State == repjob.StateCrashing && j.RepID == "" {
		return stateError
	}
	return j.State.String()
}

// parseStates reads ?states= (names of docStates); nil for none.
func parseStates(q url.Values) (map[string]bool, error) {
	raw := q.Get("states")
	if raw == "" {
		return nil, nil
	}
	want := map[string]bool{}
	var unknown []string
	for _, name := range strings.Split(raw, ",") {
		name = strings.TrimSpace(name)
		if slices.Contains(docStates, name) {
			want[name] = true
		} else {
			unknown = append(unknown, strconv.Quote(name))
		}
	}
	if len(unknown) > 0 {
		return nil, errorf(http.StatusBadRequest, "query_parse_error", "Unknown states %s. States must be one or more of %s", strings.Join(unknown, ","), strings.Join(docStates, ","))
	}
	return want, nil
}

// splitDocsPath splits the path after /_scheduler/docs/ into a _replicator
// database and a document id. The database may contain "/" written as is
// ("other/_replicator/doc") or escaped ("other%2F_replicator/doc").
func splitDocsPath(rest string) (db, docID string, err error) {
	segs := strings.Split(rest, "/")
	for i, seg := range segs {
		u, err := url.PathUnescape(seg)
		if err != nil {
			return "", "", errorf(http.StatusBadRequest, "bad_request", "invalid path segment %q", seg)
		}
		if db == "" {
			db = u
		} else {
			db += "/" + u
		}
		if db == "_replicator" || strings.HasSuffix(db, "/_replicator") {
			tail := segs[i+1:]
			for j := range tail {
				if tail[j], err = url.PathUnescape(tail[j]); err != nil {
					return "", "", errorf(http.StatusBadRequest, "bad_request", "invalid path segment %q", segs[i+1+j])
				}
			}
			return db, strings.Join(tail, "/"), nil
		}
	}
	return "", "", errorf(http.StatusBadRequest, "bad_request", "%s is not a _replicator database (its name must be _replicator or end with /_replicator)", db)
}

// schedulerDocs is GET /_scheduler/docs[/{db}[/{docid}]].
func (s *Server) schedulerDocs(w http.ResponseWriter, r *http.Request, rest string) error {
	var db, docID string
	if rest != "" {
		var err error
		if db, docID, err = splitDocsPath(rest); err != nil {
			return err
		}
	}
	pg, err := parsePaging(r.URL.Query())
	if err != nil {
		return err
	}
	states, err := parseStates(r.URL.Query())
	if err != nil {
		return err
	}
	server, err := s.serverParam(r)
	if err != nil {
		return err
	}
	if docID != "" {
		j, err := s.schedulerDoc(r.Context(), server, db, docID)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, docView(j))
		return nil
	}
	if states == nil && server == "" {
		// The store reads only the page.
		page, total, err := s.store.SchedulerDocs(r.Context(), db, pg.skip, pg.limit)
		if err != nil {
			return err
		}
		out := make([]map[string]any, 0, len(page))
		for _, j := range page {
			out = append(out, docView(j))
		}
		writeJSON(w, http.StatusOK, map[string]any{"total_rows": total, "offset": min(pg.skip, total), "docs": out})
		return nil
	}
	// A state or server filter reads every document's job (in order),
	// then pages.
	all, _, err := s.store.SchedulerDocs(r.Context(), db, 0, -1)
	if err != nil {
		return err
	}
	var docs []*Job
	for _, j := range all {
		if (states == nil || states[docState(j)]) && (server == "" || j.Server == server) {
			docs = append(docs, j)
		}
	}
	lo, hi := pg.apply(len(docs))
	out := make([]map[string]any, 0, hi-lo)
	for _, j := range docs[lo:hi] {
		out = append(out, docView(j))
	}
	writeJSON(w, http.StatusOK, map[string]any{"total_rows": len(docs), "offset": lo, "docs": out})
	return nil
}

// docView is a _scheduler/docs entry (couch_replicator job_summary,
// doc_processor ejson_doc and info_from_doc): scheduled jobs show node
// and proxies; an "error" one (docState) no source or target; finished
// ones have "id": null and no node; a document that carried its terminal
// state when the doc processor read it shows what CouchDB reads from it
// (Job.FromDoc).
func docView(j *Job) map[string]any {
	v := map[string]any{
		"server":       j.Server,
		"database":     j.Database,
		"doc_id":       j.DocID,
		"id":           strOrNil(j.RepID),
		"source":       redact.URL(j.Source),
		"target":       redact.URL(j.Target),
		"state":        j.State,
		"error_count":  j.ErrorCount,
		"info":         infoJSON(j),
		"start_time":   timeOrNil(j.CreatedAt),
		"last_updated": timeOrNil(j.LastUpdated),
	}
	if fs := writeFailures(j); fs != nil {
		v["write_failures"] = fs // couchrep's own field
	}
	if fromDoc(j, v) {
		return v
	}
	switch j.State {
	case repjob.StateCompleted, repjob.StateFailed:
		v["id"] = nil
		if j.State == repjob.StateFailed {
			v["info"] = map[string]any{"error": redact.Text(j.LastError)}
			if j.ErrorCount == 0 {
				v["error_count"] = 1
			}
		}
	default:
		v["node"] = strOrNil(j.Node)
		if docState(j) == stateError {
			v["state"], v["id"] = stateError, nil
			v["info"] = map[string]any{"error": redact.Text(j.LastError)}
			delete(v, "source")
			delete(v, "target")
			break
		}
		v["source_proxy"] = strOrNil(redact.URL(j.SourceProxy))
		v["target_proxy"] = strOrNil(redact.URL(j.TargetProxy))
		if j.State == repjob.StateCrashing {
			v["info"] = map[string]any{"error": redact.Text(j.LastError)}
		}
	}
	return v
}

// fromDoc sets v's fields from j's FromDoc, the entry read from its
// document (redacted again); it reports whether j had one.
func fromDoc(j *Job, v map[string]any) bool {
	if len(j.FromDoc) == 0 || !j.State.Terminal() {
		return false
	}
	var e map[string]json.RawMessage
	if json.Unmarshal(j.FromDoc, &e) != nil {
		return false
	}
	v["id"] = nil
	for _, k := range []string{"source", "target", "info", "error_count", "start_time", "last_updated"} {
		raw, ok := e[k]
		if !ok {
			raw = json.RawMessage("null")
		}
		shown := redact.Text(string(raw))
		if !json.Valid([]byte(shown)) {
			shown = "null"
		}
		v[k] = json.RawMessage(shown)
	}
	return true
}

// activeTasks is GET /_active_tasks: the running replications of every
// node sharing the store.
func (s *Server) activeTasks(w http.ResponseWriter, r *http.Request, _ string) error {
	all, err := s.store.List(r.Context())
	if err != nil {
		return err
	}
	var running []*Job
	for _, j := range all {
		if j.State == repjob.StateRunning {
			running = append(running, j)
		}
	}
	sort.Slice(running, func(a, b int) bool { return shownID(running[a]) < shownID(running[b]) })
	out := make([]map[string]any, 0, len(running))
	for _, j := range running {
		t := statsJSON(j.Stats)
		if t == nil {
			t = statsJSON(&messages.ReplicationStats{})
		}
		t["type"] = "replication"
		t["user"] = strOrNil(j.User)
		t["replication_id"] = shownID(j)
		t["server"], t["database"], t["doc_id"] = nil, nil, nil
		if !j.Transient {
			t["server"], t["database"], t["doc_id"] = j.Server, j.Database, j.DocID
		}
		t["source"], t["target"] = redact.URL(j.Source), redact.URL(j.Target)
		t["continuous"] = j.Continuous
		t["checkpoint_interval"] = j.CheckpointInterval.Milliseconds()
		t["pid"] = "<" + j.JobID + "@" + j.Node + ">"
		t["process_status"] = "waiting"
		t["node"] = j.Node
		started := j.LastStarted
		if started.IsZero() {
			started = j.CreatedAt
		}
		t["started_on"] = started.Unix()
		t["updated_on"] = j.LastUpdated.Unix()
		withParked(j, t)
		out = append(out, t)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
