package httpapi

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

// Metrics are the node's Prometheus metrics, served by GET /metrics:
//
//   - couchrep_replication_jobs{kind,server,database,state}: jobs in the shared
//     store by state (read from the store at scrape time, so every node
//     shows the whole cluster);
//   - couchrep_replication_jobs_parked{kind,server,database}: running jobs
//     in the shared store that are parked (idle_park_after);
//   - couchrep_replication_jobs_paused{kind,server,database}: jobs an
//     operator paused;
//   - couchrep_replication_lag_seconds{kind,server,database}: the longest
//     time a job has made no progress while changes are pending (Job.Lag);
//   - couchrep_replication_docs_written{kind,server,database}: docs_written summed
//     over the jobs in the store;
//   - couchrep_replication_docs_written_total: documents written by this
//     node's jobs (from their progress events);
//   - couchrep_replication_job_transitions_total{state}: state changes of
//     this node's jobs (started, crashed, completed, ...);
//   - couchrep_replication_rate_limited_total: 429 responses this node's
//     jobs received;
//   - couchrep_actor_restarts_total{supervisor,child}: supervisor restarts;
//   - couchrep_http_requests_total{endpoint,method,code} and
//     couchrep_http_request_duration_seconds{endpoint}: this API's traffic;
//   - what CouchDB's couch_replicator stats count (stats_descriptions.cfg),
//     listed in metrics_node.go: docs read, write failures, missing
//     revisions, checkpoints, changes-feed failures, requests to endpoints
//     and responses by outcome, bytes, worker deaths, failed starts,
//     cluster stability, store health and transaction latency, fair-share
//     usage per _replicator database;
//   - the Go runtime and process collectors.
//
// Labels have bounded cardinality: no job ids, no endpoint URLs; server is
// a watched server's URL without credentials (ServerName, bounded by
// [couchrep] watch), empty for transient jobs.
type Metrics struct {
	reg         *prometheus.Registry
	handler     http.Handler
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	restarts    *prometheus.CounterVec
	transitions *prometheus.CounterVec
	docsWritten prometheus.Counter
	rateLimited prometheus.Counter

	node *nodeMetrics
	live liveJobs // this node's running jobs' latest stats (ObserveLive)

	mu         sync.Mutex
	progressed map[string]bool // job id → made progress since it started
}

// NewMetrics registers couchrep's metrics in a new registry; store (may be
// nil) is read at every scrape for the per-database job gauges.
func NewMetrics(store Store) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "couchrep_http_requests_total", Help: "HTTP API requests by endpoint, method and status code.",
		}, []string{"endpoint", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "couchrep_http_request_duration_seconds", Help: "HTTP API request latency (POST /_replicate of a one-shot includes the whole replication).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}, []string{"endpoint"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "couchrep_actor_restarts_total", Help: "Actor restarts by supervisor and child.",
		}, []string{"supervisor", "child"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "couchrep_replication_job_transitions_total", Help: "State changes of replication jobs run by this node.",
		}, []string{"state"}),
		docsWritten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "couchrep_replication_docs_written_total", Help: "Documents written to targets by this node's replication jobs.",
		}),
		rateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "couchrep_replication_rate_limited_total", Help: "HTTP 429 responses received by this node's replication jobs.",
		}),
		progressed: map[string]bool{},
	}
	m.reg.MustRegister(m.requests, m.duration, m.restarts, m.transitions, m.docsWritten, m.rateLimited,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, st := range repjob.States {
		m.transitions.WithLabelValues(st.String())
	}
	m.node = newNodeMetrics(m.reg)
	if store != nil {
		m.WatchStore(store)
	}
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return m
}

// WatchStore makes scrapes read the per-database job gauges from store;
// call it once.
func (m *Metrics) WatchStore(store Store) {
	m.reg.MustRegister(&jobsCollector{store: store, m: m})
}

// CountersOf reads a job's counters from its stored stats (nil: zero).
func CountersOf(st *messages.ReplicationStats) JobCounters {
	return JobCounters{DocsRead: st.GetDocsRead(), DocsWritten: st.GetDocsWritten(), DocWriteFailures: st.GetDocWriteFailures(),
		MissingRevisionsFound: st.GetMissingRevisionsFound(), RevisionsChecked: st.GetRevisionsChecked()}
}

// Registry is the registry GET /metrics serves; register more collectors
// there.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

func (m *Metrics) observeRequest(endpoint, method string, code int, took time.Duration) {
	if code == 0 {
		code = http.StatusOK
	}
	m.requests.WithLabelValues(endpoint, method, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(endpoint).Observe(took.Seconds())
}

// ObserveRestart counts one restart of child by supervisor.
func (m *Metrics) ObserveRestart(supervisor, child string) {
	m.restarts.WithLabelValues(supervisor, child).Inc()
}

// ObserveRateLimited counts n responses with status 429.
func (m *Metrics) ObserveRateLimited(n int) { m.rateLimited.Add(float64(n)) }

// JobCounters are a job's cumulative counters (its _active_tasks stats).
type JobCounters struct {
	DocsRead, DocsWritten, DocWriteFailures, MissingRevisionsFound, RevisionsChecked int64
}

// ObserveJob records an event of a job run by this node: a state change
// (unless progress). The counters are not read from its stats, which
// carry over from the job's earlier runs and from its checkpoint (CouchDB's
// after a takeover): ObserveCounted counts the work. A finished job's
// bookkeeping is dropped. A job that crashes or fails before any progress
// since it started counts as a failed start.
func (m *Metrics) ObserveJob(jobID string, state repjob.State, progress bool, _ JobCounters) {
	if !progress && state != 0 {
		m.transitions.WithLabelValues(state.String()).Inc()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch state {
	case repjob.StateRunning:
		if !progress {
			m.progressed[jobID] = false
		}
	case repjob.StateCrashing, repjob.StateFailed:
		if p, ok := m.progressed[jobID]; ok && !p {
			m.node.failedStarts.Inc()
		}
	}
	if state != repjob.StateRunning && state != 0 {
		delete(m.progressed, jobID)
	}
}

// ObserveCounted adds the work a run of the job did (an increment of its
// counters, replicate.Options.OnCounted) to the node's counters: they
// count only what this process did, so that rate() shows no throughput
// when a job restarts with its counters restored.
func (m *Metrics) ObserveCounted(jobID string, c JobCounters) {
	n := m.node
	for _, d := range []struct {
		ctr prometheus.Counter
		v   int64
	}{
		{m.docsWritten, c.DocsWritten},
		{n.docsRead, c.DocsRead},
		{n.docWriteFailures, c.DocWriteFailures},
		{n.missingFound, c.MissingRevisionsFound},
		{n.revsChecked, c.RevisionsChecked},
	} {
		if d.v > 0 {
			d.ctr.Add(float64(d.v))
		}
	}
	if c.RevisionsChecked > 0 || c.DocsRead > 0 {
		m.mu.Lock()
		if _, ok := m.progressed[jobID]; ok {
			m.progressed[jobID] = true
		}
		m.mu.Unlock()
	}
}

// summaryLister is a Store that lists its jobs without the fields read
// from their documents (RepjobStore.ListSummaries), which /metrics does
// not show.
type summaryLister interface {
	ListSummaries(ctx context.Context) ([]*Job, error)
}

// summaryChanger is a Store that tells what changed since its last answer
// (RepjobStore.SummaryChanges): a scrape then reads only that.
type summaryChanger interface {
	SummaryChanges(ctx context.Context) (SummaryDelta, error)
}

// jobsCollector reads the store at scrape time.
type jobsCollector struct {
	store Store
	m     *Metrics
	agg   jobsAgg
}

var (
	jobsDesc = prometheus.NewDesc("couchrep_replication_jobs",
		"Replication jobs in the shared store by kind, watched server and _replicator database (empty for transient jobs) and state.",
		[]string{"kind", "server", "database", "state"}, nil)
	storeDocsDesc = prometheus.NewDesc("couchrep_replication_docs_written",
		"docs_written summed over the replication jobs in the shared store.",
		[]string{"kind", "server", "database"}, nil)
	parkedDesc = prometheus.NewDesc("couchrep_replication_jobs_parked",
		"Running replication jobs in the shared store that are parked (idle, their changes feed closed until their source changes), by kind, watched server and _replicator database.",
		[]string{"kind", "server", "database"}, nil)
	pausedDesc = prometheus.NewDesc("couchrep_replication_jobs_paused",
		"Replication jobs in the shared store an operator paused (couchrepctl job pause), by kind, watched server and _replicator database.",
		[]string{"kind", "server", "database"}, nil)
	lagDesc = prometheus.NewDesc("couchrep_replication_lag_seconds",
		"The longest time a job of the _replicator database (or the transient jobs) has made no progress while changes are pending on its source: "+
			"seconds since its checkpointed sequence last advanced, or since changes were first seen pending after none, whichever is later "+
			"(0 when caught up; paused and finished jobs count 0). docs/operations.md says why it is honest.",
		[]string{"kind", "server", "database"}, nil)
	scrapeErrDesc = prometheus.NewDesc("couchrep_replication_jobs_scrape_error",
		"1 if the job store could not be read for this scrape.", nil, nil)
)

func (c *jobsCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, jobsDesc, parkedDesc, pausedDesc, lagDesc, storeDocsDesc, scrapeErrDesc, pendingDesc, shareWeightDesc, shareUsageDesc, shareEntitledDesc)
}

func (c *jobsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a := &c.agg
	a.mu.Lock() // one scrape at a time: the kept sums are the collector's
	defer a.mu.Unlock()
	var d SummaryDelta
	var err error
	if s, ok := c.store.(summaryChanger); ok {
		d, err = s.SummaryChanges(ctx)
	} else {
		list := c.store.List
		if s, ok := c.store.(summaryLister); ok {
			list = s.ListSummaries // no parse of every job's document
		}
		d.Full = true
		d.Jobs, err = list(ctx)
	}
	if err != nil {
		// The sums stay as they were: the store answers the same changes
		// (or the whole listing) next time.
		ch <- prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.GaugeValue, 1)
		return
	}
	if d.Full || a.jobs == nil {
		a.reset()
	}
	if d.Each != nil {
		if err := d.Each(func(j *Job) { a.set(j.JobID, j) }); err != nil {
			a.jobs = nil // partial: the next scrape starts over (a full listing again)
			ch <- prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.GaugeValue, 1)
			return
		}
	}
	for _, id := range d.Removed {
		a.set(id, nil)
	}
	for _, j := range d.Jobs {
		a.set(j.JobID, j)
	}
	// This node's running jobs with their live stats, for this scrape.
	live := c.m.liveOverlay(a.jobs)
	for _, l := range live {
		a.apply(l.id, l.kept, -1)
		a.apply(l.id, l.now, 1)
	}
	defer func() {
		for _, l := range live {
			a.apply(l.id, l.now, -1)
			a.apply(l.id, l.kept, 1)
		}
	}()
	var weights map[string]int
	if cl, _ := c.m.node.clusterAndCheck(); cl != nil {
		weights = cl.Shares()
	}
	for _, sh := range a.sharesOf(weights) {
		ch <- prometheus.MustNewConstMetric(shareWeightDesc, prometheus.GaugeValue, float64(sh.Weight), sh.Database)
		ch <- prometheus.MustNewConstMetric(shareUsageDesc, prometheus.GaugeValue, sh.Usage, sh.Database)
		ch <- prometheus.MustNewConstMetric(shareEntitledDesc, prometheus.GaugeValue, sh.Entitled, sh.Database)
	}
	ch <- prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.GaugeValue, 0)
	now := time.Now()
	emit := func(k aggKey, v *aggVals) {
		// Every live state appears for every database seen, so that a
		// state dropping to zero is a 0 and not a vanished series.
		for _, st := range []repjob.State{repjob.StatePending, repjob.StateRunning, repjob.StateCrashing} {
			if v.states[st.String()] == 0 {
				ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, 0, k.kind, k.server, k.db, st.String())
			}
		}
		for st, n := range v.states {
			ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, float64(n), k.kind, k.server, k.db, st)
		}
		ch <- prometheus.MustNewConstMetric(storeDocsDesc, prometheus.GaugeValue, float64(v.written), k.kind, k.server, k.db)
		ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(v.parked), k.kind, k.server, k.db)
		ch <- prometheus.MustNewConstMetric(pausedDesc, prometheus.GaugeValue, float64(v.paused), k.kind, k.server, k.db)
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, v.lag(now), k.kind, k.server, k.db)
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(v.pending), k.kind, k.server, k.db)
	}
	// Transient jobs always have series, so that an empty store shows 0.
	if _, ok := a.keys[aggKey{kind: "transient"}]; !ok {
		emit(aggKey{kind: "transient"}, &aggVals{})
	}
	for k, v := range a.keys {
		emit(k, v)
	}
}
