package config

import (
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	clog "github.com/couchrep/couchrep/internal/log"
)

// Section names.
const (
	SectionCouchrep   = "couchrep"
	SectionReplicator = "replicator"
	SectionShares     = "replicator.shares"
	SectionCouchDB    = "couchdb"
	SectionLog        = "log"
	SectionAdmin      = "admin"
	SectionAdmins     = "admins"
	SectionSSL        = "ssl"
)

// sections lists every known section in documentation order. Shares and
// admins are maps: any key, checked by mapSetting.
var sections = []string{SectionCouchrep, SectionReplicator, SectionShares, SectionCouchDB, SectionLog, SectionAdmin, SectionSSL, SectionAdmins}

// setting is one known key of a fixed section.
type setting struct {
	section, key string
	v            value
	// ignored, when set, is why CouchDB's key has no effect in couchrep.
	ignored string
}

// envName is the environment variable that sets s.
func (s *setting) envName() string { return envPrefix + envPart(s.section) + "_" + envPart(s.key) }

func envPart(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '.' || r == '-' {
			return '_'
		}
		return unicode.ToUpper(r)
	}, s)
}

const maxInt = math.MaxInt

// schema is every key of the fixed sections, in documentation order.
var schema = []*setting{
	// [couchrep]
	{section: SectionCouchrep, key: "store", v: stringValue{p: func(c *Config) *string { return &c.Couchrep.Store }, ok: nonBlank, optional: true, what: "a file path or a postgres:// URL"}},
	{section: SectionCouchrep, key: "data_dir", v: stringValue{p: func(c *Config) *string { return &c.Couchrep.DataDir }, ok: nonBlank, what: "a directory path"}},
	{section: SectionCouchrep, key: "node_name", v: stringValue{p: func(c *Config) *string { return &c.Couchrep.NodeName }, ok: validNodeName, optional: true, what: "a node name without spaces (at most 255 bytes)"}},
	{section: SectionCouchrep, key: "node_types", v: listValue{p: func(c *Config) *[]string { return &c.Couchrep.NodeTypes }, allowed: []string{NodeTypeReplication, NodeTypeAPIFrontend}, nonEmpty: true, what: `a comma-separated list of "replication" and "api_frontend"`}},
	{section: SectionCouchrep, key: "http_bind", v: stringValue{p: func(c *Config) *string { return &c.Couchrep.HTTPBind }, ok: validHostPort, what: `host:port such as "127.0.0.1:5986"`}},
	{section: SectionCouchrep, key: "admin_bind", v: stringValue{p: func(c *Config) *string { return &c.Couchrep.AdminBind }, ok: validHostPort, what: `host:port such as "127.0.0.1:5987"`}},
	{section: SectionCouchrep, key: "watch", v: listValue{p: func(c *Config) *[]string { return &c.Couchrep.Watch }, item: validServerURL, what: `a comma-separated list of CouchDB server URLs such as "http://127.0.0.1:5984"`}},
	{section: SectionCouchrep, key: "on_competing_replicator", v: stringValue{p: func(c *Config) *string { return &c.Couchrep.OnCompetingReplicator }, ok: oneOf(CompetingWarn, CompetingRefuse), what: `"warn" or "refuse"`}},
	{section: SectionCouchrep, key: "durability", v: stringValue{p: func(c *Config) *string { return &c.Couchrep.Durability }, ok: oneOf(DurabilityNormal, DurabilityFull), what: `"normal" or "full"`}},
	{section: SectionCouchrep, key: "activity_timeout", v: durationValue{p: func(c *Config) *time.Duration { return &c.Couchrep.ActivityTimeout }, unit: time.Second, min: 100 * time.Millisecond}},
	{section: SectionCouchrep, key: "heartbeat_interval", v: durationValue{p: func(c *Config) *time.Duration { return &c.Couchrep.HeartbeatInterval }, unit: time.Millisecond, min: 10 * time.Millisecond}},
	{section: SectionCouchrep, key: "cluster_quiet_period", v: durationValue{p: func(c *Config) *time.Duration { return &c.Couchrep.ClusterQuietPeriod }, unit: time.Second}},
	{section: SectionCouchrep, key: "run_log", v: boolValue{p: func(c *Config) *bool { return &c.Couchrep.RunLog }}},
	{section: SectionCouchrep, key: "idle_gc_percent", v: intValue{p: func(c *Config) *int { return &c.Couchrep.IdleGCPercent }, min: 0, max: 100}},
	{section: SectionCouchrep, key: "allow_admin_party", v: boolValue{p: func(c *Config) *bool { return &c.Couchrep.AllowAdminParty }}},
	{section: SectionCouchrep, key: "auth_server", v: stringValue{p: func(c *Config) *string { return &c.Couchrep.AuthServer }, ok: validServerURL, optional: true, what: `a CouchDB server URL such as "http://127.0.0.1:5984"`}},
	{section: SectionCouchrep, key: "session_timeout", v: durationValue{p: func(c *Config) *time.Duration { return &c.Couchrep.SessionTimeout }, unit: time.Second, min: time.Second}},
	{section: SectionCouchrep, key: "auth_cache_ttl", v: durationValue{p: func(c *Config) *time.Duration { return &c.Couchrep.AuthCacheTTL }, unit: time.Second}},

	// [replicator], CouchDB 3.x main.
	{section: SectionReplicator, key: "max_jobs", v: intValue{p: func(c *Config) *int { return &c.Replicator.MaxJobs }, min: 0, max: maxInt}},
	{section: SectionReplicator, key: "interval", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.Interval }, unit: time.Millisecond, min: time.Millisecond}},
	{section: SectionReplicator, key: "max_churn", v: intValue{p: func(c *Config) *int { return &c.Replicator.MaxChurn }, min: 1, max: maxInt}},
	{section: SectionReplicator, key: "max_history", v: intValue{p: func(c *Config) *int { return &c.Replicator.MaxHistory }, min: 1, max: maxInt}},
	{section: SectionReplicator, key: "health_threshold", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.HealthThreshold }, unit: time.Second, min: time.Second}},
	{section: SectionReplicator, key: "startup_jitter", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.StartupJitter }, unit: time.Millisecond}},
	{section: SectionReplicator, key: "update_docs", v: boolValue{p: func(c *Config) *bool { return &c.Replicator.UpdateDocs }}},
	{section: SectionReplicator, key: "cluster_start_period", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.ClusterStartPeriod }, unit: time.Second}},
	{section: SectionReplicator, key: "worker_processes", v: intValue{p: func(c *Config) *int { return &c.Replicator.WorkerProcesses }, min: 1, max: maxInt}},
	{section: SectionReplicator, key: "worker_batch_size", v: intValue{p: func(c *Config) *int { return &c.Replicator.WorkerBatchSize }, min: 1, max: maxInt}},
	{section: SectionReplicator, key: "http_connections", v: intValue{p: func(c *Config) *int { return &c.Replicator.HTTPConnections }, min: 1, max: maxInt}},
	{section: SectionReplicator, key: "connection_timeout", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.ConnectionTimeout }, unit: time.Millisecond, min: time.Millisecond}},
	{section: SectionReplicator, key: "retries_per_request", v: intValue{p: func(c *Config) *int { return &c.Replicator.RetriesPerRequest }, min: 0, max: maxInt}},
	{section: SectionReplicator, key: "checkpoint_interval", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.CheckpointInterval }, unit: time.Millisecond, min: time.Millisecond}},
	{section: SectionReplicator, key: "use_checkpoints", v: boolValue{p: func(c *Config) *bool { return &c.Replicator.UseCheckpoints }}},
	{section: SectionReplicator, key: "use_bulk_get", v: boolValue{p: func(c *Config) *bool { return &c.Replicator.UseBulkGet }}},
	{section: SectionReplicator, key: "share_changes_feeds", v: boolValue{p: func(c *Config) *bool { return &c.Replicator.ShareChangesFeeds }}},
	{section: SectionReplicator, key: "use_db_updates", v: boolValue{p: func(c *Config) *bool { return &c.Replicator.UseDBUpdates }}},
	{section: SectionReplicator, key: "startup_concurrency", v: intValue{p: func(c *Config) *int { return &c.Replicator.StartupConcurrency }, min: 0, max: maxInt}},
	{section: SectionReplicator, key: "idle_park_after", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.IdleParkAfter }, unit: time.Second}},
	{section: SectionReplicator, key: "park_recheck", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.ParkRecheck }, unit: time.Second, min: time.Second}},
	{section: SectionReplicator, key: "valid_endpoint_protocols", v: listValue{p: func(c *Config) *[]string { return &c.Replicator.ValidEndpointProtocols }, allowed: []string{"http", "https"}, nonEmpty: true, what: `a comma-separated list of "http" and "https"`}},
	{section: SectionReplicator, key: "valid_proxy_protocols", v: listValue{p: func(c *Config) *[]string { return &c.Replicator.ValidProxyProtocols }, allowed: []string{"http", "https", "socks5"}, what: `a comma-separated list of "http", "https" and "socks5"`}},
	{section: SectionReplicator, key: "valid_endpoint_protocols_log", v: boolValue{p: func(c *Config) *bool { return &c.Replicator.ValidEndpointProtocolsLog }}},
	{section: SectionReplicator, key: "compress_requests", v: boolValue{p: func(c *Config) *bool { return &c.Replicator.CompressRequests }}},
	{section: SectionReplicator, key: "verify_ssl_certificates", v: boolValue{p: func(c *Config) *bool { return &c.Replicator.VerifySSLCertificates }}},
	{section: SectionReplicator, key: "verify_ssl_certificates_log", v: boolValue{p: func(c *Config) *bool { return &c.Replicator.VerifySSLCertificatesLog }}},
	{section: SectionReplicator, key: "ssl_trusted_certificates_file", v: stringValue{p: func(c *Config) *string { return &c.Replicator.SSLTrustedCertificatesFile }, optional: true, what: "a file path"}},
	{section: SectionReplicator, key: "ssl_certificate_max_depth", v: intValue{p: func(c *Config) *int { return &c.Replicator.SSLCertificateMaxDepth }, min: 0, max: maxInt}},
	{section: SectionReplicator, key: "cert_file", v: stringValue{p: func(c *Config) *string { return &c.Replicator.CertFile }, optional: true, what: "a file path"}},
	{section: SectionReplicator, key: "key_file", v: stringValue{p: func(c *Config) *string { return &c.Replicator.KeyFile }, optional: true, what: "a file path"}},
	{section: SectionReplicator, key: "password", v: stringValue{p: func(c *Config) *string { return &c.Replicator.Password }, optional: true, what: "a password"}},
	{section: SectionReplicator, key: "cacert_reload_interval_hours", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.CACertReloadInterval }, unit: time.Hour, min: time.Minute}},
	{section: SectionReplicator, key: "request_timeout", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.RequestTimeout }, unit: time.Millisecond, infinity: true}},
	{section: SectionReplicator, key: "connection_close_interval", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.ConnectionCloseInterval }, unit: time.Millisecond, min: time.Millisecond}},
	{section: SectionReplicator, key: "max_document_id_length", v: intValue{p: func(c *Config) *int { return &c.Replicator.MaxDocumentIDLength }, min: 1, max: maxInt, infinity: true}},
	{section: SectionReplicator, key: "max_document_bytes", v: intValue{p: func(c *Config) *int { return &c.Replicator.MaxDocumentBytes }, min: 1024, max: maxInt}},
	{section: SectionReplicator, key: "max_changes_row_bytes", v: intValue{p: func(c *Config) *int { return &c.Replicator.MaxChangesRowBytes }, min: 1024, max: maxInt}},
	{section: SectionReplicator, key: "max_response_bytes", v: intValue{p: func(c *Config) *int { return &c.Replicator.MaxResponseBytes }, min: 1024, max: maxInt}},
	{section: SectionReplicator, key: "missing_doc_retry_msec", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.MissingDocRetry }, unit: time.Millisecond}},
	{section: SectionReplicator, key: "session_refresh_interval_sec", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.SessionRefreshInterval }, unit: time.Second, min: time.Second}},
	{section: SectionReplicator, key: "session_min_update_interval", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.SessionMinUpdateInterval }, unit: time.Second}},
	{section: SectionReplicator, key: "socket_options", v: stringValue{p: func(c *Config) *string { return &c.Replicator.SocketOptions }, optional: true, ok: validSocketOptions, what: "an Erlang list such as [{keepalive, true}, {nodelay, true}]"}},
	{section: SectionReplicator, key: "auth_plugins", v: listValue{p: func(c *Config) *[]string { return &c.Replicator.AuthPlugins }, allowed: []string{"couch_replicator_auth_session", "couch_replicator_auth_noop"}, nonEmpty: true, what: `a comma-separated list of the auth plugins "couch_replicator_auth_session" and "couch_replicator_auth_noop"`}},
	{section: SectionReplicator, key: "iam_token_url", v: stringValue{p: func(c *Config) *string { return &c.Replicator.IAMTokenURL }, ok: validHTTPURL, optional: true, what: "an http:// or https:// URL"}},
	{section: SectionReplicator, key: "allow_credential_commands", v: boolValue{p: func(c *Config) *bool { return &c.Replicator.AllowCredentialCommands }}},
	{section: SectionReplicator, key: "credential_command_timeout", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.CredentialCommandTimeout }, unit: time.Millisecond, min: time.Millisecond}},
	{section: SectionReplicator, key: "connect_to", v: listValue{p: func(c *Config) *[]string { return &c.Replicator.ConnectTo }, item: validConnectTo, what: `a comma-separated list of "host:port:target_host:target_port"`}},
	{section: SectionReplicator, key: "usage_coeff", v: floatValue{p: func(c *Config) *float64 { return &c.Replicator.UsageCoeff }, min: 0, max: 1}},
	{section: SectionReplicator, key: "priority_coeff", v: floatValue{p: func(c *Config) *float64 { return &c.Replicator.PriorityCoeff }, min: 0, max: 1}},

	// [replicator], CouchDB's couch_jobs-based job server (fdb branch).
	{section: SectionReplicator, key: "max_acceptors", v: intValue{p: func(c *Config) *int { return &c.Replicator.MaxAcceptors }, min: 1, max: maxInt}},
	{section: SectionReplicator, key: "min_run_time_sec", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.MinRunTime }, unit: time.Second}},
	{section: SectionReplicator, key: "transient_job_max_age_sec", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.TransientJobMaxAge }, unit: time.Second, min: time.Second}},
	{section: SectionReplicator, key: "min_backoff_penalty_sec", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.MinBackoff }, unit: time.Second, min: 2 * time.Second, max: maxBackoffCap}},
	{section: SectionReplicator, key: "max_backoff_penalty_sec", v: durationValue{p: func(c *Config) *time.Duration { return &c.Replicator.MaxBackoff }, unit: time.Second, min: 2 * time.Second, max: maxBackoffCap}},
	{section: SectionReplicator, key: "create_replicator_db", v: boolValue{p: func(c *Config) *bool { return &c.Replicator.CreateReplicatorDB }}},

	// [replicator] keys CouchDB has that mean nothing to a Go replicator:
	// accepted so that a CouchDB [replicator] section loads, then reported
	// in Config.Ignored.
	{section: SectionReplicator, key: "valid_socket_options", v: ignoredValue{}, ignored: "Erlang socket options are not used"},
	{section: SectionReplicator, key: "ibrowse_options", v: ignoredValue{}, ignored: "ibrowse is CouchDB's Erlang HTTP client"},
	{section: SectionReplicator, key: "valid_ibrowse_options", v: ignoredValue{}, ignored: "ibrowse is CouchDB's Erlang HTTP client"},
	{section: SectionReplicator, key: "cluster_quiet_period", v: ignoredValue{}, ignored: "removed in CouchDB 3.4"},

	// [couchdb]
	{section: SectionCouchDB, key: "uuid", v: stringValue{p: func(c *Config) *string { return &c.CouchDB.UUID }, ok: validUUID, optional: true, what: "a server UUID without spaces, such as CouchDB's 32 hex digits"}},

	// [log]
	{section: SectionLog, key: "level", v: stringValue{p: func(c *Config) *string { return &c.Log.Level }, ok: validLogLevel, what: "a log level (" + strings.Join(clog.LevelNames(), ", ") + ")"}},
	{section: SectionLog, key: "format", v: stringValue{p: func(c *Config) *string { return &c.Log.Format }, ok: validLogFormat, what: `"auto", "json" or "console"`}},
	{section: SectionLog, key: "writer", v: ignoredValue{}, ignored: "couchrep logs to stderr; redirect it, or use journald/systemd"},
	{section: SectionLog, key: "file", v: ignoredValue{}, ignored: "couchrep logs to stderr; redirect it, or use journald/systemd"},
	{section: SectionLog, key: "include_sasl", v: ignoredValue{}, ignored: "Erlang SASL reports do not exist in couchrep"},

	// [ssl]
	{section: SectionSSL, key: "enable", v: boolValue{p: func(c *Config) *bool { return &c.SSL.Enable }}},
	{section: SectionSSL, key: "cert_file", v: stringValue{p: func(c *Config) *string { return &c.SSL.CertFile }, optional: true, what: "a file path"}},
	{section: SectionSSL, key: "key_file", v: stringValue{p: func(c *Config) *string { return &c.SSL.KeyFile }, optional: true, what: "a file path"}},

	// [admin]
	{section: SectionAdmin, key: "token", v: stringValue{p: func(c *Config) *string { return &c.Admin.Token }, ok: nonBlank, optional: true, what: "a secret token"}},
	{section: SectionAdmin, key: "pprof", v: boolValue{p: func(c *Config) *bool { return &c.Admin.Pprof }}},
}

// maxBackoffCap is CouchDB's upper bound for max_backoff_penalty_sec
// (couch_replicator_job: min(Max, 30 days)).
const maxBackoffCap = 30 * 24 * time.Hour

// lookup finds a fixed section's key.
var lookup = func() map[[2]string]*setting {
	m := make(map[[2]string]*setting, len(schema))
	for _, s := range schema {
		m[[2]string{s.section, s.key}] = s
	}
	return m
}()

// keysOf lists a section's keys in documentation order.
func keysOf(section string) []string {
	var keys []string
	for _, s := range schema {
		if s.section == section {
			keys = append(keys, s.key)
		}
	}
	return keys
}

func nonBlank(s string) bool { return strings.TrimSpace(s) != "" }

func oneOf(vals ...string) func(string) bool {
	return func(s string) bool { return slices.Contains(vals, s) }
}

func validNodeName(s string) bool {
	return s != "" && len(s) <= 255 && !strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) })
}

func validUUID(s string) bool {
	return s != "" && len(s) <= 128 && !strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) })
}

func validHostPort(s string) bool {
	_, port, err := net.SplitHostPort(s)
	return err == nil && validPort(port)
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && isDigits(p) && n >= 0 && n <= 65535
}

func validServerURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.RawQuery == "" && u.Fragment == ""
}

// validConnectTo checks one connect_to entry, host:port:target_host:target_port.
func validConnectTo(s string) bool {
	parts := strings.Split(s, ":")
	return len(parts) == 4 && parts[0] != "" && parts[2] != "" && validPort(parts[1]) && validPort(parts[3])
}

func validLogLevel(s string) bool {
	_, err := clog.ParseLevel(s)
	return err == nil
}

func validLogFormat(s string) bool {
	_, err := clog.ParseFormat(s)
	return err == nil
}

// validShareDB reports whether a [replicator.shares] key names a
// _replicator database, as CouchDB's fair share is keyed.
func validShareDB(db string) bool {
	return db == "_replicator" || (strings.HasSuffix(db, "/_replicator") && len(db) > len("/_replicator"))
}

// shareValue parses a [replicator.shares] value.
func shareValue(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	if err != nil || n < MinShares || n > MaxShares {
		return 0, false
	}
	return n, true
}

const (
	expectedShare   = "an integer from 1 to 1000"
	expectedShareDB = `a _replicator database name such as "_replicator" or "high/_replicator"`
	expectedAdmin   = "a non-empty password (plain or a CouchDB hash)"
)

// suggest returns the known key closest to key in section, or "".
func suggest(section, key string) string {
	best, bestD := "", 3
	for _, k := range keysOf(section) {
		if d := editDistance(key, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// validSocketOptions accepts an Erlang list ("[...]"); what is inside is
// read by couch.ParseSocketOptions, which drops what it does not know, as
// CouchDB drops options outside valid_socket_options.
// validHTTPURL: an absolute http(s) URL with a host.
func validHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

func validSocketOptions(s string) bool {
	t := strings.TrimSpace(s)
	return strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]")
}
