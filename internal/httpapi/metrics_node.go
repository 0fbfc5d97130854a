package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/couchrep/couchrep/internal/dbupdates"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/sharedfeed"
	"github.com/couchrep/couchrep/supervisor"
)

// nodeMetrics are what CouchDB's couch_replicator counts
// (src/couch_replicator/priv/stats_descriptions.cfg), under Prometheus
// names:
//
//	couchrep_replication_docs_read_total                 docs read from sources
//	couchrep_replication_doc_write_failures_total        docs the target refused
//	couchrep_replication_missing_revisions_found_total   revisions _revs_diff found missing
//	couchrep_replication_revisions_checked_total         revisions checked with _revs_diff
//	couchrep_replication_checkpoints_total{outcome}      success | failure
//	couchrep_replication_changes_read_failures_total     failed _changes requests
//	couchrep_replication_requests_total{method}          requests to endpoints
//	couchrep_replication_responses_total{outcome}        success | client_error | rate_limited | server_error | transport_error
//	couchrep_replication_transferred_bytes_total{direction}  sent | received (bodies)
//	couchrep_replication_worker_deaths_total             job actors that exited abnormally
//	couchrep_replication_failed_starts_total             jobs that crashed or failed before any progress
//	couchrep_actor_start_failures_total                  actors whose start failed
//	couchrep_store_transaction_duration_seconds{kind}    read | write, with retries
//	couchrep_store_transaction_errors_total{kind}
//
// and, read at scrape time: couchrep_cluster_stable, couchrep_cluster_nodes{state},
// couchrep_node_draining, couchrep_store_healthy, and per _replicator
// database couchrep_replicator_share_weight / _usage_ratio / _entitled_ratio
// and couchrep_replication_changes_pending.
type nodeMetrics struct {
	docsRead, docWriteFailures, missingFound, revsChecked prometheus.Counter
	checkpoints                                           *prometheus.CounterVec
	changesFailures                                       prometheus.Counter
	requests                                              *prometheus.CounterVec
	responses                                             *prometheus.CounterVec
	bytes                                                 *prometheus.CounterVec
	workerDeaths, failedStarts, actorStartFailures        prometheus.Counter
	txDuration                                            *prometheus.HistogramVec
	txErrors                                              *prometheus.CounterVec

	mu        sync.Mutex
	cluster   Cluster
	check     func(context.Context) error
	dbUpdates func() dbupdates.Stats
}

func newNodeMetrics(reg *prometheus.Registry) *nodeMetrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	n := &nodeMetrics{
		docsRead:           counter("couchrep_replication_docs_read_total", "Documents read from sources by this node's replication jobs."),
		docWriteFailures:   counter("couchrep_replication_doc_write_failures_total", "Documents targets refused to write (forbidden, unauthorized, too large, ...)."),
		missingFound:       counter("couchrep_replication_missing_revisions_found_total", "Revisions _revs_diff reported missing on targets."),
		revsChecked:        counter("couchrep_replication_revisions_checked_total", "Revisions checked against targets with _revs_diff."),
		checkpoints:        vec("couchrep_replication_checkpoints_total", "Checkpoints by outcome (success, failure).", "outcome"),
		changesFailures:    counter("couchrep_replication_changes_read_failures_total", "Requests to sources' _changes feeds that failed."),
		requests:           vec("couchrep_replication_requests_total", "HTTP requests replication jobs sent to endpoints, by method.", "method"),
		responses:          vec("couchrep_replication_responses_total", "Responses to replication jobs' requests by outcome (success, client_error, rate_limited, server_error, transport_error).", "outcome"),
		bytes:              vec("couchrep_replication_transferred_bytes_total", "HTTP body bytes replication jobs sent to and received from endpoints.", "direction"),
		workerDeaths:       counter("couchrep_replication_worker_deaths_total", "Replication job actors that exited abnormally (crashed or killed)."),
		failedStarts:       counter("couchrep_replication_failed_starts_total", "Replication jobs that crashed or failed before making any progress in a run."),
		actorStartFailures: counter("couchrep_actor_start_failures_total", "Actors whose start failed."),
		txDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "couchrep_store_transaction_duration_seconds", Help: "Job store transactions (read or write), including conflict retries.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"kind"}),
		txErrors: vec("couchrep_store_transaction_errors_total", "Job store transactions that returned an error.", "kind"),
	}
	for _, o := range []string{"success", "failure"} {
		n.checkpoints.WithLabelValues(o)
	}
	for _, o := range []string{"success", "client_error", "rate_limited", "server_error", "transport_error"} {
		n.responses.WithLabelValues(o)
	}
	for _, k := range []string{"read", "write"} {
		n.txErrors.WithLabelValues(k)
	}
	for m := range knownMethods {
		n.requests.WithLabelValues(m)
	}
	n.bytes.WithLabelValues("sent")
	n.bytes.WithLabelValues("received")
	reg.MustRegister(n.docsRead, n.docWriteFailures, n.missingFound, n.revsChecked, n.checkpoints, n.changesFailures,
		n.requests, n.responses, n.bytes, n.workerDeaths, n.failedStarts, n.actorStartFailures, n.txDuration, n.txErrors,
		&nodeCollector{n: n})
	return n
}

// SetCluster makes scrapes report the cluster's stability, its nodes and
// the fair-share weights from c, and the store's health from check (nil:
// healthy when a read transaction succeeds, which the jobs gauges do).
func (m *Metrics) SetCluster(c Cluster, check func(context.Context) error) {
	m.node.mu.Lock()
	defer m.node.mu.Unlock()
	m.node.cluster, m.node.check = c, check
}

func (n *nodeMetrics) clusterAndCheck() (Cluster, func(context.Context) error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cluster, n.check
}

// ObserveSharedFeeds makes scrapes report the node's shared changes feeds
// (sharedfeed.Hub.Stats): couchrep_shared_feeds, the jobs subscribed to
// them and the subscriptions that fell behind. Call it once.
func (m *Metrics) ObserveSharedFeeds(stats func() sharedfeed.Stats) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "couchrep_shared_feeds",
			Help: "Continuous _changes feeds this node's jobs share (one per source database and credentials)."},
			func() float64 { return float64(stats().Feeds) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "couchrep_shared_feed_subscriptions",
			Help: "Replication jobs following a shared feed."},
			func() float64 { return float64(stats().Subscriptions) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "couchrep_shared_feed_overflows_total",
			Help: "Jobs that fell more rows behind a shared feed than it buffers and caught up on their own."},
			func() float64 { return float64(stats().Overflows) }))
}

// ObserveDBUpdates makes scrapes report the node's _db_updates feeds
// (dbupdates.Hub.Stats): couchrep_db_updates_feeds, the parked jobs'
// watches on them, the servers whose _db_updates cannot be read and the
// wake-ups sent; GET /_up shows each server's state ("db_updates"). Call
// it once.
func (m *Metrics) ObserveDBUpdates(stats func() dbupdates.Stats) {
	m.node.mu.Lock()
	m.node.dbUpdates = stats
	m.node.mu.Unlock()
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "couchrep_db_updates_feeds",
			Help: "Continuous _db_updates feeds open on this node (one per source server and credentials)."},
			func() float64 { return float64(stats().Feeds) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "couchrep_db_updates_watches",
			Help: "Databases watched on _db_updates feeds by this node's parked jobs."},
			func() float64 { return float64(stats().Watches) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "couchrep_db_updates_servers_unsupported",
			Help: "Source servers whose _db_updates cannot be read (PouchDB Server, CouchDB without _global_changes): their jobs keep their own feeds."},
			func() float64 { return float64(stats().Unsupported) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "couchrep_db_updates_credentials_not_admin",
			Help: "Credentials of jobs a source server refused _db_updates to (401/403: not a server admin's): those jobs keep their own feeds."},
			func() float64 { return float64(stats().NotAdmin) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "couchrep_db_updates_wakes_total",
			Help: "Wake-ups _db_updates feeds sent to parked jobs."},
			func() float64 { return float64(stats().Wakes) }))
}

func (n *nodeMetrics) dbUpdatesStats() func() dbupdates.Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dbUpdates
}

// ObserveEngine counts a replication run's event (replication.Options.OnEvent).
func (m *Metrics) ObserveEngine(e replicate.Event) {
	switch e {
	case replicate.EventCheckpointRecorded:
		m.node.checkpoints.WithLabelValues("success").Inc()
	case replicate.EventCheckpointFailed:
		m.node.checkpoints.WithLabelValues("failure").Inc()
	case replicate.EventChangesReadFailed:
		m.node.changesFailures.Inc()
	}
}

// ObserveSupervisor counts a supervisor event: restarts, actors whose
// start failed, and replication job actors (children of jobs_sup) that
// exited abnormally (worker deaths).
func (m *Metrics) ObserveSupervisor(e *supervisor.Event) {
	switch e.Kind {
	case supervisor.ChildRestarted:
		m.ObserveRestart(e.Supervisor, e.Child)
	case supervisor.StartFailed:
		m.node.actorStartFailures.Inc()
	case supervisor.ChildExited:
		if strings.HasSuffix(e.Supervisor, "/jobs_sup") && e.Reason != "normal" && e.Reason != "shutdown" && e.Reason != "" {
			m.node.workerDeaths.Inc()
		}
	}
}

// ObserveStoreTx records one job store transaction.
func (m *Metrics) ObserveStoreTx(write bool, took time.Duration, err error) {
	kind := "read"
	if write {
		kind = "write"
	}
	m.node.txDuration.WithLabelValues(kind).Observe(took.Seconds())
	if err != nil && !isCanceled(err) {
		m.node.txErrors.WithLabelValues(kind).Inc()
	}
}

func isCanceled(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// knownMethods bounds the method label.
var knownMethods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true, "COPY": true}

// Transport wraps a replication job's transport so that its requests,
// responses by outcome and body bytes are counted.
func (m *Metrics) Transport(rt http.RoundTripper) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &countingTransport{rt: rt, n: m.node, rateLimited: m.rateLimited}
}

type countingTransport struct {
	rt          http.RoundTripper
	n           *nodeMetrics
	rateLimited prometheus.Counter
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	method := req.Method
	if !knownMethods[method] {
		method = "other"
	}
	t.n.requests.WithLabelValues(method).Inc()
	if req.ContentLength > 0 {
		t.n.bytes.WithLabelValues("sent").Add(float64(req.ContentLength))
	}
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		t.n.responses.WithLabelValues("transport_error").Inc()
		return resp, err
	}
	outcome := "success"
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		outcome = "rate_limited"
		t.rateLimited.Inc()
	case resp.StatusCode >= 500:
		outcome = "server_error"
	case resp.StatusCode >= 400:
		outcome = "client_error"
	}
	t.n.responses.WithLabelValues(outcome).Inc()
	if resp.Body != nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, ctr: t.n.bytes.WithLabelValues("received")}
	}
	return resp, nil
}

// countingBody counts the bytes read from a response body.
type countingBody struct {
	io.ReadCloser
	ctr prometheus.Counter
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.ctr.Add(float64(n))
	}
	return n, err
}

// nodeCollector reads the cluster view and the store's health at scrape
// time.
type nodeCollector struct{ n *nodeMetrics }

var (
	clusterStableDesc = prometheus.NewDesc("couchrep_cluster_stable",
		"1 if the cluster's membership has not changed recently (CouchDB's cluster_is_stable).", nil, nil)
	clusterNodesDesc = prometheus.NewDesc("couchrep_cluster_nodes",
		"Nodes registered in the shared store by state (alive: heartbeat recent; down).", []string{"state"}, nil)
	drainingDesc = prometheus.NewDesc("couchrep_node_draining",
		"1 if this node is drained (accepts no jobs).", nil, nil)
	storeHealthyDesc = prometheus.NewDesc("couchrep_store_healthy",
		"1 if the job store answered a health check at this scrape.", nil, nil)
	pendingDesc = prometheus.NewDesc("couchrep_replication_changes_pending",
		"changes_pending summed over the running replication jobs (live on the node running them, else as stored).", []string{"kind", "server", "database"}, nil)
	shareWeightDesc = prometheus.NewDesc("couchrep_replicator_share_weight",
		"Fair-share weight of a _replicator database ([replicator.shares]).", []string{"database"}, nil)
	shareUsageDesc = prometheus.NewDesc("couchrep_replicator_share_usage_ratio",
		"Fraction of the running persistent jobs that belong to a _replicator database.", []string{"database"}, nil)
	shareEntitledDesc = prometheus.NewDesc("couchrep_replicator_share_entitled_ratio",
		"Fraction of the running persistent jobs a _replicator database's weight entitles it to, among the databases with work.", []string{"database"}, nil)
)

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, clusterStableDesc, clusterNodesDesc, drainingDesc, storeHealthyDesc)
}

func describe(ch chan<- *prometheus.Desc, descs ...*prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cluster, check := c.n.clusterAndCheck()
	if check != nil {
		healthy := 1.0
		if err := check(ctx); err != nil {
			healthy = 0
		}
		ch <- prometheus.MustNewConstMetric(storeHealthyDesc, prometheus.GaugeValue, healthy)
	}
	if cluster == nil {
		return
	}
	nodes, err := cluster.Nodes(ctx)
	if err != nil {
		return
	}
	stable := 1.0
	if nodes.GetUnstable() {
		stable = 0
	}
	ch <- prometheus.MustNewConstMetric(clusterStableDesc, prometheus.GaugeValue, stable)
	alive, down, draining := 0, 0, 0.0
	for _, nd := range nodes.GetNodes() {
		if nd.GetAlive() {
			alive++
		} else {
			down++
		}
		if nd.GetName() == cluster.Self() && nd.GetDraining() {
			draining = 1
		}
	}
	ch <- prometheus.MustNewConstMetric(clusterNodesDesc, prometheus.GaugeValue, float64(alive), "alive")
	ch <- prometheus.MustNewConstMetric(clusterNodesDesc, prometheus.GaugeValue, float64(down), "down")
	ch <- prometheus.MustNewConstMetric(drainingDesc, prometheus.GaugeValue, draining)
}
