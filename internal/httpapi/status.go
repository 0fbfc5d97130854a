package httpapi

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/share"
	"github.com/couchrep/couchrep/messages"
)

// Cluster is what the status page shows beyond the jobs: the nodes sharing
// the store, this node's supervision tree and the fair-share weights. The
// node answers it from its actors (the same replies couchrepctl nodes and
// tree print).
type Cluster interface {
	// Nodes is the cluster view: every node, its heartbeat and drain state.
	Nodes(ctx context.Context) (*messages.NodesResponse, error)
	// Tree is this node's supervision tree.
	Tree(ctx context.Context) (*messages.TreeResponse, error)
	// Shares are the configured [replicator.shares]; other keys have
	// share.DefaultShares.
	Shares() map[string]int
	// Self is this node's name.
	Self() string
}

//go:embed statuspage
var statusFS embed.FS

// statusAssets are the page's static files: public code, served without
// authentication (the page and its data need it).
var statusAssets = func() fs.FS { f, _ := fs.Sub(statusFS, "statuspage"); return f }()

// contentSecurity keeps the page to its own scripts and styles: no inline
// script, no other origin (the node works offline, and an injected handler
// could not run even if a string escaped textContent).
const contentSecurity = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// statusPage is GET /_status (the page) and its assets and data under
// /_status/.
func (s *Server) statusPage(w http.ResponseWriter, r *http.Request, rest string) error {
	switch rest {
	case "":
		return s.serveAsset(w, "index.html")
	case "data":
		return s.statusData(w, r)
	}
	return errorf(http.StatusNotFound, "not_found", "unknown endpoint %s", r.URL.Path)
}

// statusAsset serves the page's script and style sheet.
func (s *Server) statusAsset(w http.ResponseWriter, r *http.Request, rest string) error {
	if rest != "status.js" && rest != "status.css" {
		return errorf(http.StatusNotFound, "not_found", "unknown endpoint %s", r.URL.Path)
	}
	return s.serveAsset(w, rest)
}

func (s *Server) serveAsset(w http.ResponseWriter, name string) error {
	b, err := fs.ReadFile(statusAssets, name)
	if err != nil {
		return err
	}
	ct := map[string]string{".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}[path.Ext(name)]
	writeStatus(w, ct, "no-cache", b)
	return nil
}

// writeStatus writes a reply of the status page with its security headers.
func writeStatus(w http.ResponseWriter, contentType, cacheControl string, b []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Security-Policy", contentSecurity)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", cacheControl)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// statusJSON is what the page polls (GET /_status/data).
type statusJSON struct {
	Node            string         `json:"node"`
	Now             time.Time      `json:"now"`
	ClusterUnstable bool           `json:"cluster_unstable"`
	Nodes           []statusNode   `json:"nodes"`
	Counts          map[string]int `json:"counts"`
	Jobs            []statusJob    `json:"jobs"`
	Shares          []statusShare  `json:"shares"`
	Tree            *statusTree    `json:"tree"`
	// Errors name the sections that could not be read this time.
	Errors []string `json:"errors"`
}

type statusNode struct {
	Name         string   `json:"name"`
	Types        []string `json:"types"`
	Alive        bool     `json:"alive"`
	Draining     bool     `json:"draining"`
	RunningJobs  uint32   `json:"running_jobs"`
	HeartbeatAge *float64 `json:"heartbeat_age_s"`
	HTTP         string   `json:"http"`
}

type statusJob struct {
	ID    string `json:"id"`
	RepID string `json:"rep_id"`
	// ShortID is what the page shows in its job column:
	// repjob.ShortRepID of the replication id (or the job id's first
	// characters while it has none), which couchrepctl job show accepts.
	ShortID     string    `json:"short_id"`
	State       string    `json:"state"`
	Kind        string    `json:"kind"`
	Server      string    `json:"server"`
	Database    string    `json:"database"`
	DocID       string    `json:"doc_id"`
	Source      string    `json:"source"`
	Target      string    `json:"target"`
	Continuous  bool      `json:"continuous"`
	Node        string    `json:"node"`
	DocsRead    int64     `json:"docs_read"`
	DocsWritten int64     `json:"docs_written"`
	Failures    int64     `json:"doc_write_failures"`
	Pending     *int64    `json:"changes_pending"`
	Rate        float64   `json:"docs_per_s"`
	Spark       []float64 `json:"spark"`
	ErrorCount  int       `json:"error_count"`
	LastError   string    `json:"last_error"`
	Updated     string    `json:"updated"`
	// Parked: the job is running parked (its feed closed until its
	// source changes).
	Parked bool `json:"parked"`
	// Paused: an operator paused the job (couchrepctl job pause).
	Paused bool `json:"paused"`
	// LagSeconds: how long the job has made no progress while changes
	// are pending (Job.Lag; 0 when caught up).
	LagSeconds float64 `json:"lag_seconds"`
	// RecentFailures are the last few documents the target refused
	// (couchrepctl job show lists the last 100).
	RecentFailures []failureJSON `json:"recent_failures"`
}

// statusFailures is how many of a job's refused documents the page shows.
const statusFailures = 3

type statusShare struct {
	Database string `json:"database"`
	// Servers are the watched servers whose _replicator database of this
	// name has jobs: the scheduler's fair-share account is the database
	// name (CouchDB's couch_replicator_share:key/1), one for all of them.
	Servers  []string `json:"servers"`
	Weight   int      `json:"weight"`
	Running  int      `json:"running"`
	Waiting  int      `json:"waiting"`
	Usage    float64  `json:"usage"`
	Entitled float64  `json:"entitled"`
}

type statusTree struct {
	Name        string        `json:"name"`
	Kind        string        `json:"kind"`
	State       string        `json:"state"`
	Restarts    uint32        `json:"restarts"`
	Incarnation uint64        `json:"incarnation"`
	Children    []*statusTree `json:"children,omitempty"`
}

// stateOrder sorts the page's jobs: what needs looking at first.
var stateOrder = map[repjob.State]int{repjob.StateCrashing: 0, repjob.StateRunning: 1, repjob.StatePending: 2, repjob.StateFailed: 3, repjob.StateCompleted: 4}

func (s *Server) statusData(w http.ResponseWriter, r *http.Request) error {
	ctx, now := r.Context(), time.Now()
	out := statusJSON{Node: s.nodeName, Now: now.UTC(), Counts: map[string]int{}, Nodes: []statusNode{}, Jobs: []statusJob{}, Shares: []statusShare{}, Errors: []string{}}
	jobs, err := s.store.List(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		out.Errors = append(out.Errors, "jobs: "+redact.Text(err.Error()))
	}
	samples := s.rates.observe(now, jobs)
	for _, st := range repjob.States {
		out.Counts[st.String()] = 0
	}
	sort.Slice(jobs, func(a, b int) bool {
		if oa, ob := stateOrder[jobs[a].State], stateOrder[jobs[b].State]; oa != ob {
			return oa < ob
		}
		return jobs[a].JobID < jobs[b].JobID
	})
	out.Counts["parked"] = 0 // of the running ones
	for _, j := range jobs {
		out.Counts[j.State.String()]++
		if j.Parked() {
			out.Counts["parked"]++
		}
		out.Jobs = append(out.Jobs, statusJobOf(j, samples[j.JobID]))
	}
	var weights map[string]int
	if s.cluster != nil {
		weights = s.cluster.Shares()
		if nodes, err := s.cluster.Nodes(ctx); err != nil {
			out.Errors = append(out.Errors, "nodes: "+redact.Text(err.Error()))
		} else {
			out.ClusterUnstable = nodes.GetUnstable()
			for _, n := range nodes.GetNodes() {
				sn := statusNode{Name: n.GetName(), Types: n.GetTypes(), Alive: n.GetAlive(), Draining: n.GetDraining(),
					RunningJobs: n.GetRunningJobs(), HTTP: n.GetHttpAddress()}
				if hb := n.GetLastHeartbeat(); hb != nil {
					age := max(now.Sub(hb.AsTime()).Seconds(), 0)
					sn.HeartbeatAge = &age
				}
				out.Nodes = append(out.Nodes, sn)
			}
		}
		if tree, err := s.cluster.Tree(ctx); err != nil {
			out.Errors = append(out.Errors, "tree: "+redact.Text(err.Error()))
		} else {
			out.Tree = treeOf(tree.GetRoot())
		}
	}
	out.Shares = shareUsage(jobs, weights)
	b, err := json.Marshal(out) // escapes <, > and & too
	if err != nil {
		return err
	}
	writeStatus(w, "application/json", "no-store", b)
	return nil
}

// statusJobOf is a job as the page shows it. Its docs/s is measured
// between samples (a job's stats carry over from its earlier runs, so they
// say nothing of its current speed): 0 until two samples were taken.
func statusJobOf(j *Job, sm *jobSamples) statusJob {
	short := repjob.ShortRepID(j.RepID)
	if j.RepID == "" {
		short = redact.Text(j.JobID)
		if len(short) > repjob.ShortRepIDLen {
			short = short[:repjob.ShortRepIDLen]
		}
	}
	v := statusJob{ID: j.JobID, RepID: j.RepID, ShortID: short, State: j.State.String(), Kind: "persistent", Server: j.Server, Database: j.Database, DocID: j.DocID,
		Source: redact.URL(j.Source), Target: redact.URL(j.Target), Continuous: j.Continuous, Node: j.Node,
		ErrorCount: j.ErrorCount, LastError: redact.Text(j.LastError), Spark: []float64{}, Parked: j.Parked(),
		Paused: j.Paused(), LagSeconds: j.Lag(time.Now()).Seconds(), RecentFailures: []failureJSON{}}
	if fs := writeFailures(j); len(fs) > 0 {
		v.RecentFailures = fs[max(len(fs)-statusFailures, 0):]
	}
	if j.Transient {
		v.Kind = "transient"
	}
	if !j.LastUpdated.IsZero() {
		v.Updated = j.LastUpdated.UTC().Format(time.RFC3339)
	}
	if st := j.Stats; st != nil {
		v.DocsRead, v.DocsWritten, v.Failures, v.Pending = st.DocsRead, st.DocsWritten, st.DocWriteFailures, st.ChangesPending
	}
	if sm != nil {
		v.Spark = sm.spark()
		if j.State == repjob.StateRunning {
			v.Rate = sm.rate()
		}
	}
	return v
}

// shareUsage is the fair-share view of the persistent jobs: per
// _replicator database its weight, running and waiting jobs, the fraction
// of the running persistent jobs it has (usage) and the fraction its weight
// entitles it to among the databases that have work (entitled).
func shareUsage(jobs []*Job, weights map[string]int) []statusShare {
	t := newShareTable(weights, 0)
	for _, j := range jobs {
		if j.Transient {
			continue
		}
		sh := t.row(j.Database)
		if j.Server != "" && !slices.Contains(sh.Servers, j.Server) {
			sh.Servers = append(sh.Servers, j.Server)
		}
		switch j.State {
		case repjob.StateRunning:
			sh.Running++
			t.running++
		case repjob.StatePending, repjob.StateCrashing:
			sh.Waiting++
		}
	}
	return t.rows()
}

// shareTable builds the fair-share view (shareUsage, jobsAgg.sharesOf):
// a row per _replicator database with work or a configured weight.
type shareTable struct {
	byDB    map[string]*statusShare
	weights map[string]int
	running int // running persistent jobs, all databases
}

func newShareTable(weights map[string]int, n int) *shareTable {
	t := &shareTable{byDB: make(map[string]*statusShare, n+len(weights)), weights: weights}
	for db := range weights {
		t.row(db)
	}
	return t
}

// row is db's row, made with its weight on first use.
func (t *shareTable) row(db string) *statusShare {
	if sh, ok := t.byDB[db]; ok {
		return sh
	}
	sh := &statusShare{Database: db, Weight: share.DefaultShares, Servers: []string{}}
	if w, ok := t.weights[db]; ok {
		sh.Weight = w
	}
	t.byDB[db] = sh
	return sh
}

// rows are the rows by database name, with each one's usage (its fraction
// of the running jobs) and entitlement (its weight's fraction among the
// databases with work).
func (t *shareTable) rows() []statusShare {
	activeWeight := 0
	for _, sh := range t.byDB {
		if sh.Running+sh.Waiting > 0 {
			activeWeight += sh.Weight
		}
	}
	out := make([]statusShare, 0, len(t.byDB))
	for _, sh := range t.byDB {
		if t.running > 0 {
			sh.Usage = float64(sh.Running) / float64(t.running)
		}
		if activeWeight > 0 && sh.Running+sh.Waiting > 0 {
			sh.Entitled = float64(sh.Weight) / float64(activeWeight)
		}
		slices.Sort(sh.Servers)
		out = append(out, *sh)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Database < out[b].Database })
	return out
}

func treeOf(t *messages.TreeNode) *statusTree {
	if t == nil {
		return nil
	}
	kind := "worker"
	if t.GetSupervisor() {
		kind = trimEnum(t.GetStrategy().String(), "STRATEGY_")
	}
	n := &statusTree{Name: t.GetName(), Kind: kind, State: trimEnum(t.GetState().String(), "CHILD_STATE_"),
		Restarts: t.GetRestartCount(), Incarnation: t.GetIncarnation()}
	for _, c := range t.GetChildren() {
		n.Children = append(n.Children, treeOf(c))
	}
	return n
}

func trimEnum(s, prefix string) string {
	if len(s) > len(prefix) && s[:len(prefix)] == prefix {
		s = s[len(prefix):]
	}
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// Sparkline sampling: a job's docs_written is sampled at the time the job
// recorded it (its last update: jobs write their stats to the store at
// every progress report), whenever the page (or any client) reads
// /_status/data and the value changed, or idleEvery passed without a change
// (so that an idle job draws zeros). The last sparkPoints samples are kept:
// the sparkline spans the last minutes the page was watched. Jobs that left
// the store are forgotten.
const (
	idleEvery   = 30 * time.Second
	sparkPoints = 36
)

type rateTracker struct {
	mu   sync.Mutex
	jobs map[string]*jobSamples
}

type jobSamples struct {
	at      []time.Time
	written []int64
}

// observe samples jobs at now and returns a copy of every job's samples.
func (t *rateTracker) observe(now time.Time, jobs []*Job) map[string]*jobSamples {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.jobs == nil {
		t.jobs = map[string]*jobSamples{}
	}
	seen := make(map[string]bool, len(jobs))
	out := make(map[string]*jobSamples, len(jobs))
	for _, j := range jobs {
		seen[j.JobID] = true
		if j.Stats == nil {
			continue
		}
		sm := t.jobs[j.JobID]
		if sm == nil {
			sm = &jobSamples{}
			t.jobs[j.JobID] = sm
		}
		sm.add(now, j.LastUpdated, j.Stats.DocsWritten)
		out[j.JobID] = &jobSamples{at: append([]time.Time(nil), sm.at...), written: append([]int64(nil), sm.written...)}
	}
	for id := range t.jobs {
		if !seen[id] {
			delete(t.jobs, id)
		}
	}
	return out
}

// add records written as of updated (now when unknown), read at now.
func (s *jobSamples) add(now, updated time.Time, written int64) {
	if updated.IsZero() || updated.After(now) {
		updated = now
	}
	n := len(s.at)
	switch {
	case n == 0:
	case written != s.written[n-1] && updated.After(s.at[n-1]):
	case written == s.written[n-1] && now.Sub(s.at[n-1]) >= idleEvery:
		updated = now // idle: a point at 0 docs/s
	default:
		return
	}
	s.at = append(s.at, updated)
	s.written = append(s.written, written)
	if len(s.at) > sparkPoints+1 {
		s.at, s.written = s.at[1:], s.written[1:]
	}
}

// spark is docs/s between consecutive samples (a job whose counters went
// back, restarted from an older checkpoint, shows 0).
func (s *jobSamples) spark() []float64 {
	out := make([]float64, 0, len(s.at))
	for i := 1; i < len(s.at); i++ {
		d := s.at[i].Sub(s.at[i-1]).Seconds()
		v := 0.0
		if dw := s.written[i] - s.written[i-1]; dw > 0 && d > 0 {
			v = float64(dw) / d
		}
		out = append(out, v)
	}
	return out
}

// rate is docs/s over the newest samples spanning up to a minute.
func (s *jobSamples) rate() float64 {
	n := len(s.at)
	if n < 2 {
		return 0
	}
	i := n - 2
	for i > 0 && s.at[n-1].Sub(s.at[i]) < time.Minute {
		i--
	}
	d := s.at[n-1].Sub(s.at[i]).Seconds()
	if dw := s.written[n-1] - s.written[i]; dw > 0 && d > 0 {
		return float64(dw) / d
	}
	return 0
}
