package config

import (
	"errors"
	"path/filepath"
	"time"
)

// ErrInvalid is wrapped by every *Error: a setting that is unknown, malformed
// or out of range, in a file, an environment variable, a flag or a Config
// built in Go.
var ErrInvalid = errors.New("config: invalid setting")

// Node types ([couchrep] node_types).
const (
	// NodeTypeReplication nodes accept and run replication jobs.
	NodeTypeReplication = "replication"
	// NodeTypeAPIFrontend nodes serve the HTTP API and turn _replicator
	// documents into jobs.
	NodeTypeAPIFrontend = "api_frontend"
)

// Store durability ([couchrep] durability).
const (
	// DurabilityNormal survives a crash of the process (kill -9): SQLite
	// WAL with synchronous=NORMAL. A power loss may lose the last commits.
	DurabilityNormal = "normal"
	// DurabilityFull also survives a power loss: every commit is fsynced.
	DurabilityFull = "full"
)

// What a node does about a watched server whose own replicator runs jobs
// for the same _replicator documents ([couchrep] on_competing_replicator).
const (
	// CompetingWarn logs a warning (once per database) and shows it in
	// GET /_up and couchrepctl nodes, and goes on processing.
	CompetingWarn = "warn"
	// CompetingRefuse also leaves those databases alone until the server's
	// replicator runs no job for them.
	CompetingRefuse = "refuse"
)

// Fair-share bounds for [replicator.shares], as in CouchDB
// (couch_replicator_share: ?DEFAULT_SHARES, ?MIN_SHARES, ?MAX_SHARES).
const (
	DefaultShares = 100
	MinShares     = 1
	MaxShares     = 1000
)

// StoreFileName is the embedded store's file name inside the data directory,
// used when [couchrep] store is not set.
const StoreFileName = "couchrep.db"

// Config is a node's whole configuration. Build it with Default (or Load /
// Parse), then ApplyEnv and flags; call Validate before use.
type Config struct {
	// Couchrep is the [couchrep] section: couchrep's own node settings.
	Couchrep Couchrep
	// Replicator is the [replicator] section, CouchDB's keys and defaults.
	Replicator Replicator
	// Shares is [replicator.shares]: _replicator database name to its
	// fair-share weight (MinShares..MaxShares). Databases not listed get
	// DefaultShares; use SharesFor.
	Shares map[string]int
	// CouchDB is the [couchdb] section.
	CouchDB CouchDB
	// Log is the [log] section.
	Log Log
	// Admin is the [admin] section: the admin endpoint.
	Admin Admin
	// SSL is the [ssl] section: TLS for the HTTP API.
	SSL SSL
	// Admins is the [admins] section, as in CouchDB: user name to password
	// for HTTP API basic auth. Values are kept verbatim: a plain password or
	// a CouchDB password hash ("-pbkdf2-...").
	Admins map[string]string

	// Ignored lists keys that CouchDB has but couchrep accepts without
	// effect (Erlang socket options, auth plugins, removed keys), so that a
	// [replicator] section copied from CouchDB loads; log them as warnings.
	Ignored []Ignored

	// origin records where each setting was last set, so that Validate
	// can name the file and line of a cross-field error. Copied on write.
	origin map[[2]string]origin
}

// origin is where a setting was set: a file and line, or "env NAME" /
// "flag --name" with line 0.
type origin struct {
	file string
	line int
}

// Ignored is one accepted-but-ignored setting and why it has no effect.
type Ignored struct {
	// Where names the file and line or the variable that set it.
	Where   string
	Section string
	Key     string
	Reason  string
}

// Couchrep is the [couchrep] section.
type Couchrep struct {
	// Store is the job store (store): the embedded store file, a
	// postgres:// URL, or fdb:<cluster file>. Empty means
	// <DataDir>/couchrep.db; see StorePath.
	Store string
	// DataDir is the node's data directory (data_dir): the persisted server
	// UUID and node name live there, and the store by default.
	DataDir string
	// NodeName names this node in the cluster (node_name). Empty means
	// derived by Complete: couchrep-<8 hex>@<hostname>, the hex persisted in
	// the data directory so that a restarted node keeps its name.
	NodeName string
	// NodeTypes is what this node does (node_types): NodeTypeReplication,
	// NodeTypeAPIFrontend, or both (the default).
	NodeTypes []string
	// HTTPBind is the HTTP API's listen address (http_bind).
	HTTPBind string
	// AdminBind is the admin endpoint's listen address (admin_bind).
	AdminBind string
	// Watch lists the CouchDB servers whose _replicator databases this node
	// turns into jobs (watch, comma-separated URLs).
	Watch []string
	// Durability is the store's commit durability (durability):
	// DurabilityNormal or DurabilityFull.
	Durability string
	// OnCompetingReplicator is CompetingWarn or CompetingRefuse
	// (on_competing_replicator, "warn").
	OnCompetingReplicator string
	// ActivityTimeout is how long a running job may go without its worker
	// updating it before the activity monitor hands it to another node
	// (activity_timeout, 30 s). Workers update at least twice per timeout;
	// a killed node's jobs run elsewhere within about this plus a quarter
	// of it (the monitor's check interval, at most 5 s).
	ActivityTimeout time.Duration
	// HeartbeatInterval is how often the node renews its membership record
	// in the store (heartbeat_interval, 5000 ms); a node whose record is
	// older than three intervals counts as gone.
	HeartbeatInterval time.Duration
	// ClusterQuietPeriod is how long membership must stay unchanged before
	// the node publishes "cluster stable" (cluster_quiet_period, 15 s).
	ClusterQuietPeriod time.Duration
	// RunLog records every job run's accept and last commit in the store
	// (run_log, false), so that an audit can prove no job ever ran on two
	// nodes at once. It costs a small write per job update.
	RunLog bool
	// IdleGCPercent is the Go GC's heap growth couchrepd sets while the
	// node is quiet (idle_gc_percent, 25; 0 keeps Go's default of 100
	// always): a node of thousands of idle continuous jobs then holds
	// about 1.25 times its live heap instead of twice, and is not
	// collected every two minutes by the clock, only once its heap grew by
	// that much (a soft memory limit, unless GOMEMLIMIT is set). Go's
	// default comes back as soon as the node allocates again. GOGC in the
	// environment overrides it. Programs embedding a node keep their own GC settings.
	IdleGCPercent int
	// AllowAdminParty lets the HTTP API listen beyond loopback without
	// [admins] (allow_admin_party, false): as Apache CouchDB 3, couchrep
	// otherwise refuses to start an open API that other machines can reach.
	AllowAdminParty bool
	// AuthServer is the CouchDB server whose users may use the HTTP API
	// (auth_server): a request's Basic credentials or AuthSession cookie
	// are checked with GET /_session there, and its userCtx (name, roles)
	// is the request's; the _admin role makes a server admin. Empty means
	// the first of Watch, once [admins] is set; with neither [admins] nor
	// auth_server the API is an admin party. See UsersAuthServer.
	AuthServer string
	// SessionTimeout is how long a cookie of POST /_session stays valid
	// (session_timeout, 600 s, CouchDB's [chttpd_auth] timeout); it is
	// the cookie's Max-Age, renewed once a tenth of it has passed.
	SessionTimeout time.Duration
	// AuthCacheTTL is how long an answer of the auth server is remembered
	// (auth_cache_ttl, 10 s; 0 asks it on every request). Entries are
	// keyed by a hash of the credentials, never the password.
	AuthCacheTTL time.Duration
}

// UsersAuthServer returns the server whose users the HTTP API accepts:
// [couchrep] auth_server, or the first watched server when [admins] is set,
// or "" (only [admins], or an admin party when that is empty too).
func (c Config) UsersAuthServer() string {
	switch {
	case c.Couchrep.AuthServer != "":
		return c.Couchrep.AuthServer
	case len(c.Admins) > 0 && len(c.Couchrep.Watch) > 0:
		return c.Couchrep.Watch[0]
	}
	return ""
}

// Replicator is the [replicator] section. Times are time.Duration; in the
// file they are integers in CouchDB's unit for that key (see the package
// documentation) or Go duration strings such as "30s".
type Replicator struct {
	// MaxJobs is the most jobs running on this node (max_jobs, 500).
	MaxJobs int
	// Interval is the scheduler's period (interval, 60000 ms).
	Interval time.Duration
	// MaxChurn is the most jobs stopped per scheduler cycle (max_churn, 20).
	MaxChurn int
	// MaxHistory is the number of events kept per job (max_history, 20).
	MaxHistory int
	// HealthThreshold is how long a job must run cleanly for its crash count
	// to reset (health_threshold, 120 s).
	HealthThreshold time.Duration
	// StartupJitter is the upper bound of the random delay before a job
	// starts (startup_jitter, 5000 ms).
	StartupJitter time.Duration
	// UpdateDocs writes triggered/error states into _replicator documents
	// too, not only terminal states (update_docs, false).
	UpdateDocs bool
	// ClusterStartPeriod delays the first scan of _replicator databases
	// (cluster_start_period, 5 s).
	ClusterStartPeriod time.Duration

	// WorkerProcesses is the per-job default of worker_processes (4).
	WorkerProcesses int
	// WorkerBatchSize is the per-job default of worker_batch_size (500).
	WorkerBatchSize int
	// HTTPConnections is the per-job default of http_connections (20).
	HTTPConnections int
	// ConnectionTimeout is the per-job default of connection_timeout
	// (30000 ms).
	ConnectionTimeout time.Duration
	// RetriesPerRequest is the per-job default of retries_per_request (5).
	RetriesPerRequest int
	// CheckpointInterval is the per-job default of checkpoint_interval
	// (30000 ms).
	CheckpointInterval time.Duration
	// UseCheckpoints is the per-job default of use_checkpoints (true).
	UseCheckpoints bool
	// UseBulkGet is the per-job default of use_bulk_get (true).
	UseBulkGet bool
	// ShareChangesFeeds lets the continuous replications of a node that
	// read the same source database (same URL, credentials and connection
	// settings) share one _changes feed (share_changes_feeds, true; a
	// couchrep key). Jobs with a selector or a named filter never share.
	ShareChangesFeeds bool
	// UseDBUpdates lets continuous replications that went idle sleep
	// without a _changes feed, woken by one _db_updates feed per source
	// server shared by the node (use_db_updates, true; a couchrep key).
	// Where the server's _db_updates cannot be read (not a server admin,
	// PouchDB Server, CouchDB without _global_changes) jobs keep their
	// feeds.
	UseDBUpdates bool
	// StartupConcurrency is how many jobs of a node go through their
	// start-up (infos, checkpoints, catch-up) at once against one source
	// server, and how many of their start-up requests and of the node's
	// checkpoint requests it has in flight at once per server; the others
	// wait their turn, running (startup_concurrency, 20; a couchrep key;
	// 0: no limit).
	StartupConcurrency int
	// IdleParkAfter parks a continuous replication that has had no change
	// for this long (idle_park_after, 60 s; 0 never parks; a couchrep key):
	// its feed, workers and connections are closed and it waits for its
	// source to change (the source server's _db_updates feed, and
	// ParkRecheck), then resumes from its checkpoint. Only jobs without a
	// filter, doc_ids or selector park, and only where the source server's
	// _db_updates can be read. A run that finds nothing to replicate at
	// start-up parks 2 s after its feed opens, or after this if shorter
	// (replicate's quietParkAfter).
	IdleParkAfter time.Duration
	// ParkRecheck is how often a parked job re-reads its source database's
	// update_seq, in case an event of _db_updates was lost (park_recheck,
	// 1800 s; a couchrep key): each job's rechecks are jittered (half to
	// one and a half times it), and the node sends at most park.DefaultRate
	// (5) of them a second in all, however many jobs are parked.
	ParkRecheck time.Duration

	// ValidEndpointProtocols are the URL schemes accepted for sources and
	// targets (valid_endpoint_protocols, "http,https").
	ValidEndpointProtocols []string
	// ValidProxyProtocols are the proxy URL schemes accepted
	// (valid_proxy_protocols, "http,https,socks5").
	ValidProxyProtocols []string
	// ValidEndpointProtocolsLog logs a security warning for plain-http
	// endpoints (valid_endpoint_protocols_log, false).
	ValidEndpointProtocolsLog bool
	// CompressRequests sends _bulk_docs, _revs_diff and _bulk_get bodies
	// of 8 KiB or more gzip-compressed to endpoints that accept them
	// (compress_requests, false; couchrep's own: CouchDB's replicator
	// never compresses). It pays on links slower than ~250 Mbit/s per
	// connection (BENCHMARKS.md).
	CompressRequests bool
	// VerifySSLCertificates verifies TLS certificates and host names of
	// endpoints (verify_ssl_certificates, false — CouchDB's default).
	VerifySSLCertificates bool
	// VerifySSLCertificatesLog logs a security warning for certificates
	// that do not verify (verify_ssl_certificates_log, false).
	VerifySSLCertificatesLog bool
	// SSLTrustedCertificatesFile is a PEM bundle of CAs trusted instead of
	// the system's (ssl_trusted_certificates_file).
	SSLTrustedCertificatesFile string
	// SSLCertificateMaxDepth is the longest accepted chain below the root
	// (ssl_certificate_max_depth, 3).
	SSLCertificateMaxDepth int
	// CertFile is a client certificate (PEM) presented to endpoints
	// (cert_file).
	CertFile string
	// KeyFile is CertFile's private key (key_file).
	KeyFile string
	// Password decrypts KeyFile (password).
	Password string
	// CACertReloadInterval is how often the system CA pool is re-read
	// (cacert_reload_interval_hours, 24 h).
	CACertReloadInterval time.Duration
	// RequestTimeout bounds every request except _changes feeds, from
	// sending it to the end of its response body (request_timeout,
	// infinity); an attempt it ends is retried like a connection error.
	// Zero means no timeout.
	RequestTimeout time.Duration
	// ConnectionCloseInterval closes idle pooled connections after this
	// long (connection_close_interval, 90000 ms).
	ConnectionCloseInterval time.Duration
	// MaxDocumentIDLength skips documents with longer IDs, counting them
	// as doc_write_failures (max_document_id_length, infinity). Zero means
	// no limit.
	MaxDocumentIDLength int
	// MaxDocumentBytes bounds one document read from a source, inline
	// attachments included (max_document_bytes, 32 MiB; couchrep's own): a
	// larger one crashes the job with an error naming the limit.
	MaxDocumentBytes int
	// MaxChangesRowBytes bounds one row of a source's _changes feed
	// (max_changes_row_bytes, 8 MiB; couchrep's own).
	MaxChangesRowBytes int
	// MaxResponseBytes bounds an endpoint's response that is read whole:
	// database info, _revs_diff, _bulk_docs and open_revs answers
	// (max_response_bytes, 64 MiB; couchrep's own).
	MaxResponseBytes int
	// MissingDocRetry is the wait before refetching a document after
	// missing_doc/missing_stub (missing_doc_retry_msec, 2000 ms).
	MissingDocRetry time.Duration
	// SessionRefreshInterval is how often a session cookie without Max-Age
	// is refreshed (session_refresh_interval_sec, 550 s).
	SessionRefreshInterval time.Duration
	// SessionMinUpdateInterval is the least time between two cookie
	// refreshes caused by 401/403 (session_min_update_interval, 5 s).
	SessionMinUpdateInterval time.Duration
	// SocketOptions are CouchDB's socket_options, an Erlang list such as
	// "[{keepalive, true}, {nodelay, false}]": keepalive, nodelay, sndbuf
	// and recbuf are applied to every endpoint connection, the rest is
	// ignored. Empty keeps Go's defaults: keep-alive on and TCP_NODELAY on
	// (CouchDB's default turns nodelay off; see README "Real endpoints").
	SocketOptions string
	// AuthPlugins are the auth plugins tried in order (auth_plugins,
	// "couch_replicator_auth_session,couch_replicator_auth_noop"): cookie
	// sessions from /_session, then Basic auth.
	AuthPlugins []string
	// IAMTokenURL is where an endpoint's "auth": {"iam": {"api_key"}} is
	// exchanged for a bearer token (iam_token_url, IBM Cloud's
	// https://iam.cloud.ibm.com/identity/token; couchrep's own key).
	IAMTokenURL string
	// AllowCredentialCommands lets replication documents take a bearer
	// token from a program ("auth": {"bearer": {"command": [...]}}) or a
	// file of this node ("auth": {"bearer": {"token_file": ...}})
	// (allow_credential_commands, false: a document must not run programs
	// or read the node's files unless the operator says so).
	AllowCredentialCommands bool
	// CredentialCommandTimeout bounds one run of a credential command
	// (credential_command_timeout, 10 s): one that takes longer is killed.
	CredentialCommandTimeout time.Duration
	// ConnectTo overrides where endpoints connect, like curl --connect-to:
	// entries "host:port:target_host:target_port", host may start with "*."
	// (connect_to, comma-separated).
	ConnectTo []string
	// UsageCoeff is the fair-share usage decay K1 (usage_coeff, 0.5).
	UsageCoeff float64
	// PriorityCoeff is the fair-share priority decay K2 (priority_coeff,
	// 0.98).
	PriorityCoeff float64

	// The keys below are those of CouchDB's couch_jobs-based replicator
	// (the FoundationDB branch), whose job server couchrep follows.

	// MaxAcceptors is the number of idle acceptors waiting on the job queue
	// (max_acceptors, 2).
	MaxAcceptors int
	// MinRunTime protects a continuous job from being stopped for rotation
	// before it has run this long (min_run_time_sec). The default is 0,
	// CouchDB 3.x's rotation, which the scheduler follows: with the
	// FoundationDB-era default of 60 s and interval = 60 s, a job started at
	// one tick would be just short of the minimum at the next, and rotation
	// would silently slow to every other interval.
	MinRunTime time.Duration
	// TransientJobMaxAge is how long a finished _replicate job is kept for
	// _scheduler/jobs (transient_job_max_age_sec, 86400 s).
	TransientJobMaxAge time.Duration
	// MinBackoff is the first crash backoff; it doubles per consecutive
	// crash (min_backoff_penalty_sec, 32 s).
	MinBackoff time.Duration
	// MaxBackoff caps the crash backoff (max_backoff_penalty_sec,
	// 172800 s, at most 30 days).
	MaxBackoff time.Duration
	// CreateReplicatorDB creates missing _replicator databases on watched
	// servers (create_replicator_db, false).
	CreateReplicatorDB bool
}

// CouchDB is the [couchdb] section.
type CouchDB struct {
	// UUID is the server UUID, the first element of every replication ID
	// (uuid). Set it to a CouchDB server's [couchdb] uuid to resume from
	// that server's checkpoints. Empty means generated once and persisted
	// in the data directory (see Complete and EnsureUUID); a node then
	// adopts the UUID already recorded in its shared job store, so that
	// every node sharing a store computes the same replication ids.
	UUID string
	// Generated is set by Complete when it filled UUID from the data
	// directory rather than from the configuration.
	Generated bool
	// Adopted is set when UUID was taken from a CouchDB server
	// (couchrepd --adopt-uuid): the node then records it in the shared job
	// store in place of the one recorded there, so that every node sharing
	// the store computes the server's replication ids.
	Adopted bool
}

// Log is the [log] section.
type Log struct {
	// Level is the least severe level logged (level, "info"): CouchDB's
	// names (debug, info, notice, warning, error, critical, alert,
	// emergency, none) plus trace and warn.
	Level string
	// Format is "auto" (console text on a terminal, JSON otherwise),
	// "json" or "console" (format, "auto").
	Format string
}

// SSL is the [ssl] section, as in CouchDB: the HTTP API served over TLS.
type SSL struct {
	// Enable serves the HTTP API (http_bind) over TLS only (enable, false).
	Enable bool
	// CertFile is the server certificate chain, PEM (cert_file).
	CertFile string
	// KeyFile is CertFile's private key, PEM (key_file).
	KeyFile string
}

// Admin is the [admin] section: couchrep's admin endpoint.
type Admin struct {
	// Token is the admin endpoint's shared secret (token). It is required
	// when AdminBind is not a loopback address.
	Token string
	// Pprof serves Go's profiles (net/http/pprof) under /debug/pprof/ on
	// the admin endpoint (pprof; off by default), behind Token when set.
	Pprof bool
}

// Default returns the configuration with CouchDB's defaults where CouchDB
// has the key, and couchrep's own otherwise.
func Default() Config {
	return Config{
		Couchrep: Couchrep{
			DataDir:    ".data",
			NodeTypes:  []string{NodeTypeReplication, NodeTypeAPIFrontend},
			HTTPBind:   "127.0.0.1:5986",
			AdminBind:  "127.0.0.1:5987",
			Durability: DurabilityNormal,

			OnCompetingReplicator: CompetingWarn,

			ActivityTimeout:    30 * time.Second,
			HeartbeatInterval:  5000 * time.Millisecond,
			ClusterQuietPeriod: 15 * time.Second,
			IdleGCPercent:      25,
			SessionTimeout:     600 * time.Second,
			AuthCacheTTL:       10 * time.Second,
		},
		Replicator: Replicator{
			MaxJobs:            500,
			Interval:           60000 * time.Millisecond,
			MaxChurn:           20,
			MaxHistory:         20,
			HealthThreshold:    120 * time.Second,
			StartupJitter:      5000 * time.Millisecond,
			UpdateDocs:         false,
			ClusterStartPeriod: 5 * time.Second,

			WorkerProcesses:    4,
			WorkerBatchSize:    500,
			HTTPConnections:    20,
			ConnectionTimeout:  30000 * time.Millisecond,
			RetriesPerRequest:  5,
			CheckpointInterval: 30000 * time.Millisecond,
			UseCheckpoints:     true,
			UseBulkGet:         true,
			ShareChangesFeeds:  true,
			UseDBUpdates:       true,
			StartupConcurrency: 20,
			IdleParkAfter:      60 * time.Second,
			ParkRecheck:        1800 * time.Second,

			ValidEndpointProtocols:   []string{"http", "https"},
			ValidProxyProtocols:      []string{"http", "https", "socks5"},
			SSLCertificateMaxDepth:   3,
			CACertReloadInterval:     24 * time.Hour,
			ConnectionCloseInterval:  90000 * time.Millisecond,
			MissingDocRetry:          2000 * time.Millisecond,
			SessionRefreshInterval:   550 * time.Second,
			SessionMinUpdateInterval: 5 * time.Second,
			AuthPlugins:              []string{"couch_replicator_auth_session", "couch_replicator_auth_noop"},
			IAMTokenURL:              "https://iam.cloud.ibm.com/identity/token",
			CredentialCommandTimeout: 10 * time.Second,
			UsageCoeff:               0.5,
			PriorityCoeff:            0.98,

			MaxDocumentBytes:   32 << 20,
			MaxChangesRowBytes: 8 << 20,
			MaxResponseBytes:   64 << 20,

			MaxAcceptors:       2,
			TransientJobMaxAge: 86400 * time.Second,
			MinBackoff:         32 * time.Second,
			MaxBackoff:         172800 * time.Second,
		},
		Shares: map[string]int{},
		Log:    Log{Level: "info", Format: "auto"},
		Admins: map[string]string{},
	}
}

// SharesFor returns the fair-share weight of a _replicator database:
// its [replicator.shares] value, or DefaultShares.
func (c Config) SharesFor(db string) int {
	if s, ok := c.Shares[db]; ok {
		return s
	}
	return DefaultShares
}

// StorePath returns the embedded store's file: [couchrep] store, or
// couchrep.db in the data directory.
func (c Config) StorePath() string {
	if c.Couchrep.Store != "" {
		return c.Couchrep.Store
	}
	return filepath.Join(c.Couchrep.DataDir, StoreFileName)
}

// HasNodeType reports whether the node is of type t (NodeTypeReplication or
// NodeTypeAPIFrontend).
func (c Config) HasNodeType(t string) bool {
	for _, nt := range c.Couchrep.NodeTypes {
		if nt == t {
			return true
		}
	}
	return false
}
