// Package takeover asks a CouchDB server which replicators work on its
// _replicator databases besides this couchrep store: its own replicator
// ([replicator] max_jobs, _active_tasks, _scheduler/docs) and other couchrep
// stores (the marker each store writes into the _replicator databases it
// follows). The same facts answer two questions: the node's periodic
// competing-replicator check (internal/docproc: GET /_up, couchrepctl nodes,
// logs) and the preconditions of couchrepctl takeover (Checks).
//
// A fact the server does not answer is unknown, with the reason, never
// taken for "none": PouchDB Server and CouchDB 1.x have no
// /_node/_local/_config, so whether their replicator is on is unknown.
package takeover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// Paths the probe reads, as reasons and next steps name them.
const (
	NodeConfigPath = "/_node/_local/_config/replicator"
	OldConfigPath  = "/_config/replicator"
	TasksPath      = "/_active_tasks"
	SchedulerPath  = "/_scheduler/docs?states=running,crashing"
)

// Facts are what one server answered about the replicators working on it.
type Facts struct {
	// Server is the server's URL without credentials.
	Server string
	// UUID is GET /'s uuid ("" with UUIDReason when unknown).
	UUID, UUIDReason string
	// Replicator is [replicator] max_jobs: the server's own replicator.
	Replicator ReplicatorConfig
	// Tasks are the replication tasks of GET /_active_tasks.
	Tasks Tasks
	// Scheduler is GET /_scheduler/docs?states=running,crashing.
	Scheduler Scheduler
	// Markers are the couchrep stores' markers in the _replicator
	// databases.
	Markers Markers
}

// ReplicatorConfig is what the server's configuration says of its own
// replicator.
type ReplicatorConfig struct {
	// Known: MaxJobs was read (from Source).
	Known   bool
	MaxJobs int
	// Source is the path it was read from.
	Source string
	// Reason says why it is unknown.
	Reason string
}

// On reports whether the server's own replicator may run jobs.
func (c ReplicatorConfig) On() bool { return c.Known && c.MaxJobs > 0 }

// Tasks is the replication part of GET /_active_tasks.
type Tasks struct {
	Known bool
	// Replication is the number of tasks of "type": "replication".
	Replication int
	Reason      string
}

// Scheduler is GET /_scheduler/docs?states=running,crashing.
type Scheduler struct {
	// Known: the server answered (Present false: it has no _scheduler,
	// PouchDB Server or CouchDB 1.x).
	Known, Present bool
	// Jobs are the running or crashing documents per _replicator database.
	Jobs   map[string]int
	Reason string
}

// Markers are the couchrep markers found in the _replicator databases.
type Markers struct {
	// Known: every database's marker document was read (missing counts as
	// read: no store marked it).
	Known  bool
	Reason string
	// Databases are the _replicator databases looked at.
	Databases []string
	// Others are the entries of stores other than the prober's.
	Others []Marker
}

// Live returns the other stores' markers that are not stale.
func (m Markers) Live() []Marker {
	var out []Marker
	for _, o := range m.Others {
		if o.Live {
			out = append(out, o)
		}
	}
	return out
}

// Prober asks one server for its Facts.
type Prober struct {
	// Endpoint is the server root, with (admin) credentials.
	Endpoint couch.Endpoint
	// Options are the couch client options (HTTP client, retries, logger).
	Options couch.Options
	// StoreID is this couchrep store's id (StoreID): its own marker is no
	// other replicator.
	StoreID string
	// Clock returns the time markers are judged by; nil means time.Now.
	Clock func() time.Time
}

// Probe reads the facts. dbs are the _replicator databases whose markers
// are read; nil lists them with GET /_all_dbs. It never fails: what a
// request could not tell is unknown, with the reason.
func (p Prober) Probe(ctx context.Context, dbs []string) Facts {
	f := Facts{Server: p.Endpoint.Redacted()}
	f.UUID, f.UUIDReason = p.uuid(ctx)
	f.Replicator = p.replicatorConfig(ctx)
	f.Tasks = p.tasks(ctx)
	f.Scheduler = p.scheduler(ctx)
	f.Markers = p.markers(ctx, dbs)
	return f
}

// at returns the endpoint of rawPath (ending in "/") under the server root.
func (p Prober) at(rawPath string) couch.Endpoint {
	u := *p.Endpoint.URL
	base := u.EscapedPath()
	if base == "" || base[len(base)-1] != '/' {
		base += "/"
	}
	raw := base + rawPath
	u.RawPath = raw
	u.Path, _ = url.PathUnescape(raw)
	ep := p.Endpoint
	ep.URL = &u
	return ep
}

// get reads doc under the endpoint of dir ("" is the server root).
func (p Prober) get(ctx context.Context, dir, doc string, q url.Values) (json.RawMessage, error) {
	return couch.NewDB(p.at(dir), p.Options).GetDoc(ctx, doc, q)
}

// status is the HTTP status of a couch error, or 0.
func status(err error) int {
	var he *couch.HTTPError
	if errors.As(err, &he) {
		return he.Status
	}
	return 0
}

// failed says why a request failed, without credentials (couch errors
// carry redacted URLs).
func failed(path string, err error) string {
	switch s := status(err); {
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return fmt.Sprintf("GET %s answered %d: watch the server with server-admin credentials", path, s)
	case s != 0:
		return fmt.Sprintf("GET %s answered %d", path, s)
	default:
		return fmt.Sprintf("GET %s failed: %v", path, err)
	}
}

func (p Prober) uuid(ctx context.Context) (string, string) {
	raw, err := p.get(ctx, "", "", nil)
	if err != nil {
		return "", failed("/", err)
	}
	var root struct {
		UUID string `json:"uuid"`
	}
	if json.Unmarshal(raw, &root) != nil || root.UUID == "" {
		return "", `GET / has no "uuid"`
	}
	return root.UUID, ""
}

// replicatorConfig reads [replicator] max_jobs from
// /_node/_local/_config/replicator (CouchDB 2+), or /_config/replicator
// where the former is missing (CouchDB 1.x, PouchDB Server).
func (p Prober) replicatorConfig(ctx context.Context) ReplicatorConfig {
	raw, err := p.get(ctx, "_node/_local/_config/", "replicator", nil)
	src := NodeConfigPath
	if s := status(err); s == http.StatusNotFound || s == http.StatusBadRequest {
		first := fmt.Sprintf("GET %s answered %d", NodeConfigPath, s)
		raw, err = p.get(ctx, "_config/", "replicator", nil)
		src = OldConfigPath
		if err != nil {
			return ReplicatorConfig{Reason: first + "; " + failed(OldConfigPath, err) + ": whether the server's own replicator runs is unknown"}
		}
		var sec map[string]any
		if json.Unmarshal(raw, &sec) == nil {
			if _, ok := sec["max_jobs"]; !ok {
				return ReplicatorConfig{Reason: first + " and " + OldConfigPath + " has no max_jobs: whether the server's own replicator runs is unknown"}
			}
		}
	}
	if err != nil {
		return ReplicatorConfig{Reason: failed(src, err)}
	}
	var sec map[string]json.RawMessage
	if err := json.Unmarshal(raw, &sec); err != nil {
		return ReplicatorConfig{Reason: fmt.Sprintf("GET %s is not a config section", src)}
	}
	v, ok := sec["max_jobs"]
	if !ok {
		// CouchDB's default when local.ini does not set it.
		return ReplicatorConfig{Known: true, MaxJobs: 500, Source: src + " (max_jobs not set: CouchDB's default 500)"}
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		s = string(v)
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return ReplicatorConfig{Reason: fmt.Sprintf("GET %s: max_jobs %q is not a number", src, s)}
	}
	return ReplicatorConfig{Known: true, MaxJobs: n, Source: src}
}

func (p Prober) tasks(ctx context.Context) Tasks {
	raw, err := p.get(ctx, "", "_active_tasks", nil)
	if err != nil {
		return Tasks{Reason: failed(TasksPath, err)}
	}
	var tasks []struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &tasks); err != nil {
		return Tasks{Reason: "GET " + TasksPath + " is not a list of tasks"}
	}
	t := Tasks{Known: true}
	for _, x := range tasks {
		if x.Type == "replication" {
			t.Replication++
		}
	}
	return t
}

// competingStates are the _scheduler/docs states of a document whose job
// the server runs or will retry. "pending" is not among them: with
// [replicator] max_jobs = 0 every document stays pending and nothing runs.
var competingStates = []string{"running", "crashing", "error"}

func (p Prober) scheduler(ctx context.Context) Scheduler {
	q := url.Values{"states": {"running,crashing"}, "limit": {"10000"}}
	raw, err := p.get(ctx, "_scheduler/", "docs", q)
	switch s := status(err); {
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return Scheduler{Reason: failed("/_scheduler/docs", err)}
	case (s >= 400 && s < 500) || s == http.StatusNotImplemented:
		return Scheduler{Known: true, Reason: fmt.Sprintf("GET /_scheduler/docs answered %d: no replication scheduler", s)}
	case err != nil:
		return Scheduler{Reason: failed("/_scheduler/docs", err)}
	}
	var sd struct {
		Docs []struct {
			Database string `json:"database"`
			State    string `json:"state"`
		} `json:"docs"`
	}
	if json.Unmarshal(raw, &sd) != nil || sd.Docs == nil {
		return Scheduler{Known: true, Reason: "GET /_scheduler/docs is not a scheduler's answer: no replication scheduler"}
	}
	sc := Scheduler{Known: true, Present: true}
	for _, d := range sd.Docs {
		if !IsReplicatorDB(d.Database) || !slices.Contains(competingStates, d.State) {
			continue
		}
		if sc.Jobs == nil {
			sc.Jobs = map[string]int{}
		}
		sc.Jobs[d.Database]++
	}
	return sc
}

// IsReplicatorDB reports whether a database is a _replicator database:
// named "_replicator" or ending in "/_replicator".
func IsReplicatorDB(name string) bool {
	return name == "_replicator" || strings.HasSuffix(name, "/_replicator")
}

// replicatorDBs lists the server's _replicator databases (GET /_all_dbs).
func (p Prober) replicatorDBs(ctx context.Context) ([]string, error) {
	raw, err := p.get(ctx, "", "_all_dbs", nil)
	if err != nil {
		return nil, err
	}
	var all []string
	if err := json.Unmarshal(raw, &all); err != nil {
		return nil, fmt.Errorf("GET /_all_dbs is not a list of names: %w", err)
	}
	var out []string
	for _, db := range all {
		if IsReplicatorDB(db) {
			out = append(out, db)
		}
	}
	return out, nil
}
