package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/dbupdates"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/replicate"
)

// DefaultMaxBodyBytes is the largest request body accepted when
// Options.MaxBodyBytes is zero (CouchDB's max_http_request_size is 4 GiB;
// a replication document is a few KiB).
const DefaultMaxBodyBytes = 8 << 20

// Options configure a Server.
type Options struct {
	// Store holds the replication jobs. Required.
	Store Store
	// Admins are the [admins] section: user name to password (plain or a
	// CouchDB hash). Empty means no authentication ("admin party").
	Admins map[string]string
	// Logger receives one debug line per request and every server error.
	Logger zerolog.Logger
	// Metrics is where requests are counted and what GET /metrics serves;
	// nil means a new NewMetrics(Store).
	Metrics *Metrics
	// MaxBodyBytes limits request bodies (413 beyond it); zero means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// AuthFailureBurst is how many failed logins a client address may
	// make in a row before it must wait (429); zero means
	// DefaultAuthFailureBurst. AuthFailureInterval is how often one more
	// attempt is allowed after that; zero means DefaultAuthFailureInterval.
	AuthFailureBurst    int
	AuthFailureInterval time.Duration
	// UUID is the server uuid GET / shows.
	UUID string
	// NodeName is the name of the node serving the API (the status page
	// shows it).
	NodeName string
	// Cluster gives the status page the nodes, the supervision tree and the
	// shares; nil leaves those sections empty.
	Cluster Cluster
	// Competing returns what the check for competing replicators found on
	// each watched server (GET /_up "competing_replicators"); nil leaves it
	// out.
	Competing func() any
	// Warnings are shown by GET /_up ("warnings"), e.g. an open file limit
	// below what the node may need (config.FDWarning).
	Warnings []string
	// Users lets CouchDB users of an auth server in (see UsersOptions).
	Users UsersOptions
	// CredentialCommands is [replicator] allow_credential_commands: with
	// replicate.CredentialCommandsRefused, POST /_replicate answers 400 to
	// an endpoint whose auth.bearer reads a file or runs a program.
	CredentialCommands replicate.CredentialPolicy
	// Servers are the servers this node watches ([couchrep] watch; their
	// credentials are dropped here): GET /_scheduler/docs/{db}/{docid}
	// refuses a document id that is in db on several of them unless
	// ?server= names one.
	Servers []string
	// Replicator is the node's [replicator] section: POST /_verify builds
	// its endpoints and per-job defaults from it (nil: CouchDB's defaults).
	Replicator *config.Replicator
}

// Server is the HTTP API's handler. It is safe for concurrent use.
type Server struct {
	store   Store
	admins  map[string]string
	log     zerolog.Logger
	metrics *Metrics
	maxBody int64

	uuid, nodeName string
	cluster        Cluster
	rates          rateTracker
	competing      func() any
	guard          *authGuard
	users          *users
	warnings       []string
	servers        []string // ServerName of each watched server
	credCommands   replicate.CredentialPolicy
	replicator     config.Replicator
}

// New returns the API handler.
func New(o Options) *Server {
	s := &Server{store: o.Store, admins: o.Admins, log: o.Logger, metrics: o.Metrics, maxBody: o.MaxBodyBytes,
		uuid: o.UUID, nodeName: o.NodeName, cluster: o.Cluster, competing: o.Competing, warnings: o.Warnings,
		guard: newAuthGuard(o.AuthFailureBurst, o.AuthFailureInterval), users: newUsers(o.Users, o.Admins),
		credCommands: o.CredentialCommands}
	for _, w := range o.Servers {
		if n := ServerName(w); n != "" && !slices.Contains(s.servers, n) {
			s.servers = append(s.servers, n)
		}
	}
	if o.Replicator != nil {
		s.replicator = *o.Replicator
	}
	if s.metrics == nil {
		s.metrics = NewMetrics(o.Store)
	}
	if o.Store != nil {
		s.store = liveStore{Store: o.Store, m: s.metrics}
	}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	return s
}

// Metrics returns the metrics the server records into and serves.
func (s *Server) Metrics() *Metrics { return s.metrics }

// apiError is an error reply: status code, CouchDB's error name, reason.
type apiError struct {
	status       int
	code, reason string
	retryAfter   time.Duration // sent as Retry-After when set
	// bare sends the error name alone, without a reason, as CouchDB does
	// for some answers (cancelNotFound).
	bare bool
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.code, e.reason) }

func errorf(status int, code, format string, a ...any) *apiError {
	return &apiError{status: status, code: code, reason: fmt.Sprintf(format, a...)}
}

// statusWriter records the status code for logs and metrics.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// route is one endpoint: its metric label, allowed methods and handler.
type route struct {
	name    string
	methods string // "GET,HEAD" or "POST"
	open    bool   // no authentication
	handle  func(w http.ResponseWriter, r *http.Request, rest string) error
}

func (s *Server) route(path string) (route, string, bool) {
	switch {
	case path == "":
		return route{name: "welcome", methods: "GET,HEAD", open: true, handle: s.welcome}, "", true
	case path == "/_status" || path == "/_status/data":
		return route{name: "status", methods: "GET,HEAD", handle: s.statusPage}, strings.TrimPrefix(strings.TrimPrefix(path, "/_status"), "/"), true
	case strings.HasPrefix(path, "/_status/"):
		return route{name: "status_asset", methods: "GET,HEAD", open: true, handle: s.statusAsset}, strings.TrimPrefix(path, "/_status/"), true
	case path == "/_session":
		return route{name: "session", methods: "GET,HEAD,POST,DELETE", open: true, handle: s.session}, "", true
	case path == "/_replicate":
		return route{name: "replicate", methods: "POST", handle: s.replicate}, "", true
	case path == "/_verify":
		return route{name: "verify", methods: "POST", handle: s.verify}, "", true
	case path == "/_scheduler/jobs" || strings.HasPrefix(path, "/_scheduler/jobs/"):
		return route{name: "scheduler_jobs", methods: "GET,HEAD", handle: s.schedulerJobs}, strings.TrimPrefix(strings.TrimPrefix(path, "/_scheduler/jobs"), "/"), true
	case path == "/_scheduler/docs" || strings.HasPrefix(path, "/_scheduler/docs/"):
		return route{name: "scheduler_docs", methods: "GET,HEAD", handle: s.schedulerDocs}, strings.TrimPrefix(strings.TrimPrefix(path, "/_scheduler/docs"), "/"), true
	case path == "/_active_tasks":
		return route{name: "active_tasks", methods: "GET,HEAD", handle: s.activeTasks}, "", true
	case path == "/_up":
		return route{name: "up", methods: "GET,HEAD", open: true, handle: s.up}, "", true
	case path == "/metrics" || path == "/_node/_local/_prometheus":
		return route{name: "metrics", methods: "GET,HEAD", handle: s.serveMetrics}, "", true
	}
	return route{name: "unknown"}, "", false
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	reqID := setDefaultHeaders(w, r)
	sw := &statusWriter{ResponseWriter: w}
	// rest keeps percent-escapes: _scheduler/docs needs to tell an escaped
	// "/" (part of a name) from a separator.
	rt, rest, ok := s.route(strings.TrimSuffix(r.URL.Path, "/"))
	if _, escRest, escOK := s.route(strings.TrimSuffix(r.URL.EscapedPath(), "/")); ok && escOK {
		rest = escRest
	}
	user := ""
	defer func() {
		if p := recover(); p != nil {
			s.log.Error().Str("method", r.Method).Str("path", r.URL.Path).Str("request_id", reqID).Interface("panic", p).
				Str("stack", string(debug.Stack())).Msg("http api handler panicked")
			if sw.status == 0 {
				writeError(sw, errorf(http.StatusInternalServerError, "unknown_error", "internal server error"))
			}
		}
		s.metrics.observeRequest(rt.name, r.Method, sw.status, time.Since(start))
		s.log.Debug().Str("method", r.Method).Str("path", r.URL.Path).Str("user", user).Str("request_id", reqID).
			Int("status", sw.status).Dur("took", time.Since(start)).Msg("http request")
	}()
	if !ok {
		writeError(sw, errorf(http.StatusNotFound, "not_found", "unknown endpoint %s", r.URL.Path))
		return
	}
	if !methodAllowed(rt.methods, r.Method) {
		sw.Header().Set("Allow", rt.methods)
		writeError(sw, errorf(http.StatusMethodNotAllowed, "method_not_allowed", "Only %s allowed", rt.methods))
		return
	}
	var uc UserCtx
	if !rt.open {
		var aerr *apiError
		if uc, aerr = s.authenticate(sw, r, rt.name); aerr != nil {
			if aerr.status == http.StatusUnauthorized {
				sw.Header().Set("WWW-Authenticate", `Basic realm="couchrep"`)
			}
			if aerr.retryAfter > 0 {
				sw.Header().Set("Retry-After", strconv.Itoa(int(aerr.retryAfter.Round(time.Second)/time.Second)+1))
			}
			writeError(sw, aerr)
			return
		}
	}
	user = uc.Name
	r = r.WithContext(withUser(r.Context(), uc))
	if err := rt.handle(sw, r, rest); err != nil {
		var aerr *apiError
		if !errors.As(err, &aerr) {
			if r.Context().Err() != nil {
				// The client left, or the node is stopping.
				aerr = errorf(http.StatusServiceUnavailable, "service_unavailable", "request cancelled: %v", context.Cause(r.Context()))
			} else {
				// Handlers return their own errors as *apiError: anything
				// else comes from the job store, which is unreachable or
				// failing. The client may retry.
				s.log.Error().Err(errors.New(redact.Text(err.Error()))).Str("method", r.Method).Str("path", r.URL.Path).Str("request_id", reqID).Msg("http api request failed: job store error")
				aerr = errorf(http.StatusServiceUnavailable, "service_unavailable", "the job store is unavailable: %s", redact.Text(err.Error()))
			}
		}
		writeError(sw, aerr)
	}
}

func methodAllowed(methods, m string) bool {
	for _, a := range strings.Split(methods, ",") {
		if a == m {
			return true
		}
	}
	return false
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.bare {
		writeJSON(w, e.status, map[string]string{"error": e.code})
		return
	}
	writeJSON(w, e.status, map[string]string{"error": e.code, "reason": redact.Text(e.reason)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // "<job@node>" pids as CouchDB writes them
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString(`{"error":"unknown_error","reason":"cannot encode the reply"}` + "\n")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "must-revalidate")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// readJSONBody reads a POST body: at most maxBody bytes, a JSON content
// type (or none), valid JSON.
func (s *Server) readJSONBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return nil, errorf(http.StatusUnsupportedMediaType, "bad_content_type", "Content-Type must be application/json")
		}
	}
	if r.ContentLength > s.maxBody {
		return nil, errorf(http.StatusRequestEntityTooLarge, "too_large", "the request body is %d bytes, more than the limit of %d bytes", r.ContentLength, s.maxBody)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errorf(http.StatusRequestEntityTooLarge, "too_large", "the request body is more than the limit of %d bytes", mbe.Limit)
		}
		return nil, errorf(http.StatusBadRequest, "bad_request", "cannot read the request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, errorf(http.StatusBadRequest, "bad_request", "Request body must be a JSON object, got an empty body")
	}
	if aerr := checkJSONBody(body); aerr != nil {
		return nil, aerr
	}
	return body, nil
}

// paramError turns a validation error into CouchDB's reply.
func paramError(err error) *apiError {
	var pe *replicate.ParamError
	if errors.As(err, &pe) {
		return errorf(http.StatusBadRequest, pe.Code, "%s", pe.Reason)
	}
	return errorf(http.StatusBadRequest, "bad_request", "%v", err)
}

// dbUpdatesState is one server's line in GET /_up "db_updates".
type dbUpdatesState struct {
	State   dbupdates.State `json:"state"`
	Reason  string          `json:"reason,omitempty"`
	Since   time.Time       `json:"since"`
	Watches int             `json:"watches"`
	// NotAdmin counts the credentials of the server's jobs it refused
	// (401/403): those jobs keep their own feeds.
	NotAdmin int `json:"not_admin_credentials,omitempty"`
}

// dbUpdatesUp is GET /_up's "db_updates": each source server with a
// _db_updates feed or found unable to serve one (its redacted URL) and its
// state: ok, opening, retrying or unsupported, with the reason. Feeds of
// one server with other credentials add their watches, and the worst state
// shows. Credentials the server refused (401/403: not a server admin's)
// are a verdict on them, not on the server: they are counted
// (not_admin_credentials) and show as the state (not_admin) only when the
// server has no other line.
func dbUpdatesUp(st dbupdates.Stats) map[string]dbUpdatesState {
	rank := map[dbupdates.State]int{dbupdates.StateNotAdmin: -1, dbupdates.StateOK: 0, dbupdates.StateOpening: 1,
		dbupdates.StateRetrying: 2, dbupdates.StateUnsupported: 3}
	out := make(map[string]dbUpdatesState, len(st.Servers))
	for _, s := range st.Servers {
		cur, ok := out[s.Name]
		line := dbUpdatesState{State: s.State, Reason: s.Reason, Since: s.Since, Watches: s.Watches}
		if ok {
			line.Watches += cur.Watches
			line.NotAdmin = cur.NotAdmin
			if rank[cur.State] > rank[s.State] {
				line.State, line.Reason, line.Since = cur.State, cur.Reason, cur.Since
			}
		}
		if s.State == dbupdates.StateNotAdmin {
			line.NotAdmin++
		}
		out[s.Name] = line
	}
	return out
}

// up is liveness: 200 {"status":"ok"} while the node's job store answers,
// 503 {"status":"error","store":"unavailable"} while it does not (the
// reason is in the node's log and couchrepctl tree, not on this open
// endpoint). A node watching servers adds what the check for competing
// replicators found on each, and a node that wakes parked jobs by
// _db_updates the state of each source server's feed ("db_updates").
func (s *Server) up(w http.ResponseWriter, r *http.Request, _ string) error {
	if _, check := s.metrics.node.clusterAndCheck(); check != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := check(ctx); err != nil {
			s.log.Warn().Err(err).Msg("_up: job store unavailable")
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "error", "seeds": map[string]any{}, "store": "unavailable"})
			return nil
		}
	}
	body := map[string]any{"status": "ok", "seeds": map[string]any{}, "store": "ok"}
	if s.competing != nil {
		body["competing_replicators"] = s.competing()
	}
	if stats := s.metrics.node.dbUpdatesStats(); stats != nil {
		body["db_updates"] = dbUpdatesUp(stats())
	}
	if len(s.warnings) > 0 {
		body["warnings"] = s.warnings
	}
	writeJSON(w, http.StatusOK, body)
	return nil
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request, _ string) error {
	s.metrics.handler.ServeHTTP(w, r)
	return nil
}
