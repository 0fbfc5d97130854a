package config

import (
	"errors"
	"flag"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDefaultsMatchCouchDB checks every default against the values in
// reference/couchdb-replicator.md §2 (and §8 for the couch_jobs-era keys),
// written as CouchDB writes them, in CouchDB's unit.
func TestDefaultsMatchCouchDB(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		"replicator.max_jobs":                      "500",
		"replicator.interval":                      "60000",
		"replicator.max_churn":                     "20",
		"replicator.max_history":                   "20",
		"replicator.health_threshold":              "120",
		"replicator.startup_jitter":                "5000",
		"replicator.update_docs":                   "false",
		"replicator.cluster_start_period":          "5",
		"replicator.worker_processes":              "4",
		"replicator.worker_batch_size":             "500",
		"replicator.http_connections":              "20",
		"replicator.connection_timeout":            "30000",
		"replicator.retries_per_request":           "5",
		"replicator.checkpoint_interval":           "30000",
		"replicator.use_checkpoints":               "true",
		"replicator.use_bulk_get":                  "true",
		"replicator.valid_endpoint_protocols":      "http,https",
		"replicator.valid_proxy_protocols":         "http,https,socks5",
		"replicator.valid_endpoint_protocols_log":  "false",
		"replicator.compress_requests":             "false",
		"replicator.verify_ssl_certificates":       "false",
		"replicator.verify_ssl_certificates_log":   "false",
		"replicator.ssl_trusted_certificates_file": "",
		"replicator.ssl_certificate_max_depth":     "3",
		"replicator.cert_file":                     "",
		"replicator.key_file":                      "",
		"replicator.password":                      "",
		"replicator.cacert_reload_interval_hours":  "24",
		"replicator.request_timeout":               "infinity",
		"replicator.connection_close_interval":     "90000",
		"replicator.max_document_id_length":        "infinity",
		"replicator.missing_doc_retry_msec":        "2000",
		"replicator.session_refresh_interval_sec":  "550",
		"replicator.session_min_update_interval":   "5",
		"replicator.connect_to":                    "",
		"replicator.socket_options":                "",
		"replicator.auth_plugins":                  "couch_replicator_auth_session,couch_replicator_auth_noop",
		"replicator.iam_token_url":                 "https://iam.cloud.ibm.com/identity/token", // couchrep's own key (IBM's endpoint)
		"replicator.allow_credential_commands":     "false",                                    // couchrep's own key
		"replicator.credential_command_timeout":    "10000",                                    // couchrep's own key
		"replicator.usage_coeff":                   "0.5",
		"replicator.priority_coeff":                "0.98",
		"replicator.max_acceptors":                 "2",
		"replicator.min_run_time_sec":              "0", // 3.x rotation; the fdb branch had 60
		"replicator.transient_job_max_age_sec":     "86400",
		"replicator.min_backoff_penalty_sec":       "32",
		"replicator.max_backoff_penalty_sec":       "172800",
		"replicator.create_replicator_db":          "false",
		"couchdb.uuid":                             "",
		"log.level":                                "info",
		"log.format":                               "auto",
		"admin.token":                              "",
		"admin.pprof":                              "false",
		"couchrep.store":                           "",
		"couchrep.data_dir":                        ".data",
		"couchrep.node_name":                       "",
		"couchrep.node_types":                      "replication,api_frontend",
		"couchrep.http_bind":                       "127.0.0.1:5986",
		"couchrep.admin_bind":                      "127.0.0.1:5987",
		"couchrep.watch":                           "",
		"couchrep.durability":                      "normal",
		"couchrep.on_competing_replicator":         "warn",
		"couchrep.activity_timeout":                "30",
		"couchrep.heartbeat_interval":              "5000",
		"couchrep.cluster_quiet_period":            "15",
		"couchrep.run_log":                         "false",
		"couchrep.idle_gc_percent":                 "25",
		"couchrep.allow_admin_party":               "false",
		"couchrep.auth_server":                     "",
		"couchrep.session_timeout":                 "600",
		"couchrep.auth_cache_ttl":                  "10",
		"replicator.max_document_bytes":            "33554432",
		"replicator.max_changes_row_bytes":         "8388608",
		"replicator.max_response_bytes":            "67108864",
		"replicator.share_changes_feeds":           "true", // couchrep's own key
		"replicator.use_db_updates":                "true", // couchrep's own key
		"replicator.startup_concurrency":           "20",   // couchrep's own key
		"replicator.idle_park_after":               "60",   // couchrep's own key
		"replicator.park_recheck":                  "1800", // couchrep's own key
		"ssl.enable":                               "false",
		"ssl.cert_file":                            "",
		"ssl.key_file":                             "",
	}
	d := Default()
	for _, s := range schema {
		if s.ignored != "" {
			continue
		}
		id := s.section + "." + s.key
		w, ok := want[id]
		if !ok {
			t.Errorf("%s: no expected default in this table; add CouchDB's", id)
			continue
		}
		if got := s.v.get(&d); got != w {
			t.Errorf("%s default = %q, want %q", id, got, w)
		}
		delete(want, id)
	}
	for id := range want {
		t.Errorf("%s: expected a setting with this name", id)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	// The typed fields, for the keys whose units matter most.
	typed := []struct {
		name      string
		got, want time.Duration
	}{
		{"interval", d.Replicator.Interval, time.Minute},
		{"health_threshold", d.Replicator.HealthThreshold, 2 * time.Minute},
		{"startup_jitter", d.Replicator.StartupJitter, 5 * time.Second},
		{"checkpoint_interval", d.Replicator.CheckpointInterval, 30 * time.Second},
		{"connection_timeout", d.Replicator.ConnectionTimeout, 30 * time.Second},
		{"min_backoff_penalty_sec", d.Replicator.MinBackoff, 32 * time.Second},
		{"max_backoff_penalty_sec", d.Replicator.MaxBackoff, 48 * time.Hour},
	}
	for _, tc := range typed {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if got := d.SharesFor("any/_replicator"); got != 100 {
		t.Errorf("SharesFor(unlisted) = %d, want CouchDB's default 100", got)
	}
}

func TestParseValues(t *testing.T) {
	t.Parallel()
	const ini = "\ufeff; couchrep test config\n" +
		"[couchrep]\n" +
		"node_types = replication\n" +
		"watch = http://a:5984 , https://admin:pw@b.example:6984/\n" +
		"store = /var/lib/couchrep/store.db\n" +
		"\n" +
		"[replicator]\n" +
		"max_jobs = 7 ; a comment after a value\n" +
		"interval = 1m30s\n" +
		"health_threshold = 30\n" +
		"request_timeout = 1500\n" +
		"max_document_id_length = 5\n" +
		"use_bulk_get = false\n" +
		"usage_coeff = 1\n" +
		"connect_to = *.example.com:443:127.0.0.1:8443\n" +
		"socket_options = [{keepalive, true}, {nodelay, false}]\n" +
		"ibrowse_options = [{prefer_ipv6, true}]\n" +
		"max_churn =\n" + // empty: the default
		"# hash comments too\n" +
		"[replicator.shares]\n" +
		"high/_replicator = 200\n" +
		"_replicator = 1\n" +
		"[couchdb]\n" +
		"uuid = 0123456789abcdef0123456789abcdef\n" +
		"[log]\n" +
		"level = warning\n" +
		"[admins]\n" +
		"admin = -pbkdf2-abc,def,10\n" +
		"[replicator]\r\n" + // repeated section, CRLF line ends
		"worker_processes = 2\r\n"
	c, err := Parse("t.ini", strings.NewReader(ini))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"node_types", c.Couchrep.NodeTypes, []string{"replication"}},
		{"watch", c.Couchrep.Watch, []string{"http://a:5984", "https://admin:pw@b.example:6984/"}},
		{"store", c.StorePath(), "/var/lib/couchrep/store.db"},
		{"max_jobs", c.Replicator.MaxJobs, 7},
		{"interval", c.Replicator.Interval, 90 * time.Second},
		{"health_threshold", c.Replicator.HealthThreshold, 30 * time.Second},
		{"request_timeout", c.Replicator.RequestTimeout, 1500 * time.Millisecond},
		{"max_document_id_length", c.Replicator.MaxDocumentIDLength, 5},
		{"use_bulk_get", c.Replicator.UseBulkGet, false},
		{"usage_coeff", c.Replicator.UsageCoeff, 1.0},
		{"connect_to", c.Replicator.ConnectTo, []string{"*.example.com:443:127.0.0.1:8443"}},
		{"socket_options", c.Replicator.SocketOptions, "[{keepalive, true}, {nodelay, false}]"},
		{"max_churn", c.Replicator.MaxChurn, 20},
		{"worker_processes", c.Replicator.WorkerProcesses, 2},
		{"shares", c.Shares, map[string]int{"high/_replicator": 200, "_replicator": 1}},
		{"shares for high", c.SharesFor("high/_replicator"), 200},
		{"uuid", c.CouchDB.UUID, "0123456789abcdef0123456789abcdef"},
		{"log level", c.Log.Level, "warning"},
		{"admins", c.Admins, map[string]string{"admin": "-pbkdf2-abc,def,10"}},
		{"ignored", len(c.Ignored), 1},
		{"is replication", c.HasNodeType(NodeTypeReplication), true},
		{"is frontend", c.HasNodeType(NodeTypeAPIFrontend), false},
	}
	for _, tc := range checks {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s = %#v, want %#v", tc.name, tc.got, tc.want)
		}
	}
	if len(c.Ignored) == 1 && (c.Ignored[0].Key != "ibrowse_options" || c.Ignored[0].Where != "t.ini:17") {
		t.Errorf("Ignored = %+v, want ibrowse_options at t.ini:17", c.Ignored[0])
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
}

// TestParseErrors has one case per class of error; each message must name
// the file, the line, the section and key, and what was expected.
func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		ini     string
		line    int
		section string
		key     string
		msg     string // substring of the whole message
	}{
		{"unknown key", "[replicator]\nmax_jbos = 5\n", 2, "replicator", "max_jbos",
			`t.ini:2: [replicator] max_jbos: expected a known [replicator] key (did you mean "max_jobs"?), got "max_jbos"`},
		{"unknown key far from any", "[couchrep]\nzzzzzzzzzz = 5\n", 2, "couchrep", "zzzzzzzzzz",
			`t.ini:2: [couchrep] zzzzzzzzzz: expected a known [couchrep] key, got "zzzzzzzzzz"`},
		{"unknown section", "[replicator]\nmax_jobs = 1\n[chttpd]\nport = 5984\n", 3, "", "",
			`t.ini:3: expected a known section ([couchrep], [replicator], [replicator.shares], [couchdb], [log], [admin], [ssl], [admins]), got "[chttpd]"`},
		{"unknown auth plugin", "[replicator]\nauth_plugins = couch_replicator_auth_session,my_ldap_plugin\n", 2, "replicator", "auth_plugins",
			`t.ini:2: [replicator] auth_plugins: expected a comma-separated list of the auth plugins "couch_replicator_auth_session" and "couch_replicator_auth_noop", got "couch_replicator_auth_session,my_ldap_plugin"`},
		{"socket_options not a list", "[replicator]\nsocket_options = keepalive\n", 2, "replicator", "socket_options",
			`t.ini:2: [replicator] socket_options: expected an Erlang list such as [{keepalive, true}, {nodelay, true}], got "keepalive"`},
		{"bad number", "[replicator]\nmax_jobs = abc\n", 2, "replicator", "max_jobs",
			`t.ini:2: [replicator] max_jobs: expected a non-negative integer, got "abc"`},
		{"negative number", "[replicator]\n\nmax_jobs = -1\n", 3, "replicator", "max_jobs",
			`t.ini:3: [replicator] max_jobs: expected a non-negative integer, got "-1"`},
		{"zero workers", "[replicator]\nworker_processes = 0\n", 2, "replicator", "worker_processes",
			`expected a positive integer, got "0"`},
		{"bad duration", "[replicator]\ninterval = 10 minutes\n", 2, "replicator", "interval",
			`t.ini:2: [replicator] interval: expected a whole number of milliseconds (at least 1) or a duration such as "30s", got "10 minutes"`},
		{"negative duration", "[replicator]\nstartup_jitter = -5s\n", 2, "replicator", "startup_jitter",
			`expected a whole number of milliseconds or a duration such as "30s", got "-5s"`},
		{"duration in seconds", "[replicator]\nhealth_threshold = 1.5\n", 2, "replicator", "health_threshold",
			`expected a whole number of seconds (at least 1) or a duration such as "30s", got "1.5"`},
		{"backoff over 30 days", "[replicator]\nmax_backoff_penalty_sec = 2592001\n", 2, "replicator", "max_backoff_penalty_sec",
			`expected a whole number of seconds from 2 to 2592000 or a duration such as "30s", got "2592001"`},
		{"bad infinity", "[replicator]\nrequest_timeout = forever\n", 2, "replicator", "request_timeout",
			`or a duration such as "30s", or "infinity", got "forever"`},
		{"bad bool", "[replicator]\nuse_checkpoints = yes\n", 2, "replicator", "use_checkpoints",
			`t.ini:2: [replicator] use_checkpoints: expected true or false, got "yes"`},
		{"bad float", "[replicator]\npriority_coeff = 1.5\n", 2, "replicator", "priority_coeff",
			`expected a number from 0 to 1, got "1.5"`},
		{"share too big", "[replicator.shares]\nhigh/_replicator = 1001\n", 2, "replicator.shares", "high/_replicator",
			`t.ini:2: [replicator.shares] high/_replicator: expected an integer from 1 to 1000, got "1001"`},
		{"share zero", "[replicator.shares]\n_replicator = 0\n", 2, "replicator.shares", "_replicator",
			`expected an integer from 1 to 1000, got "0"`},
		{"share not a replicator db", "[replicator.shares]\nhigh = 5\n", 2, "replicator.shares", "high",
			`expected a _replicator database name such as "_replicator" or "high/_replicator", got "high"`},
		{"duplicate key", "[replicator]\nmax_jobs = 1\n[log]\nlevel = info\n[replicator]\nmax_jobs = 2\n", 6, "replicator", "max_jobs",
			`t.ini:6: [replicator] max_jobs: expected each key once per file (first set on line 2), got "max_jobs"`},
		{"key before section", "max_jobs = 1\n", 1, "", "max_jobs",
			`t.ini:1: expected a "[section]" header before the first key, got "max_jobs = 1"`},
		{"no equals", "[replicator]\nmax_jobs\n", 2, "replicator", "",
			`t.ini:2: [replicator]: expected "key = value", a "[section]" header or a "; comment", got "max_jobs"`},
		{"bad header", "[replicator\n", 1, "", "", `expected a section header such as "[replicator]", got "[replicator"`},
		{"bad address", "[couchrep]\nhttp_bind = 5986\n", 2, "couchrep", "http_bind",
			`t.ini:2: [couchrep] http_bind: expected host:port such as "127.0.0.1:5986", got "5986"`},
		{"bad node type", "[couchrep]\nnode_types = replication, frontend\n", 2, "couchrep", "node_types",
			`expected a comma-separated list of "replication" and "api_frontend", got "replication, frontend"`},
		{"bad watch url", "[couchrep]\nwatch = localhost:5984\n", 2, "couchrep", "watch",
			`expected a comma-separated list of CouchDB server URLs`},
		{"bad log level", "[log]\nlevel = loud\n", 2, "log", "level", `expected a log level (trace, debug, info`},
		{"bad durability", "[couchrep]\ndurability = paranoid\n", 2, "couchrep", "durability", `expected "normal" or "full", got "paranoid"`},
		{"bad protocol", "[replicator]\nvalid_endpoint_protocols = http,ftp\n", 2, "replicator", "valid_endpoint_protocols", `got "http,ftp"`},
		{"bad connect_to", "[replicator]\nconnect_to = a:1:b\n", 2, "replicator", "connect_to", `"host:port:target_host:target_port"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("t.ini", strings.NewReader(tc.ini))
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(err, ErrInvalid) = false for %v", err)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is not an *Error: %v", err, err)
			}
			if e.File != "t.ini" || e.Line != tc.line || e.Section != tc.section || e.Key != tc.key {
				t.Errorf("Error{File %q, Line %d, Section %q, Key %q}, want {t.ini, %d, %q, %q}",
					e.File, e.Line, e.Section, e.Key, tc.line, tc.section, tc.key)
			}
			if e.Expected == "" {
				t.Error("Error.Expected is empty")
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("message\n  %s\ndoes not contain\n  %s", err, tc.msg)
			}
		})
	}
}

func TestParseReportsSeveralErrors(t *testing.T) {
	t.Parallel()
	_, err := Parse("t.ini", strings.NewReader("[replicator]\nmax_jobs = x\nmax_churn = y\n[nope]\nignored_below_unknown_section = 1\nnot even a key\n[bad header\nskipped = too\n"))
	if err == nil {
		t.Fatal("want errors")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{"t.ini:2: [replicator] max_jobs", "t.ini:3: [replicator] max_churn", "t.ini:4: expected a known section", "t.ini:7: expected a section header"}
	if len(lines) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("error %d = %q, want prefix %q", i, lines[i], w)
		}
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "couchrep.ini")
	if err := os.WriteFile(path, []byte("[replicator]\nmax_jobs = 3\n[log]\nlevel = bad\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path+":4: [log] level: expected a log level") {
		t.Errorf("Load(invalid) = %v, want an error naming %s:4", err, path)
	}

	t.Run("missing file", func(t *testing.T) {
		missing := filepath.Join(dir, "nope.ini")
		_, err := Load(missing)
		if err == nil {
			t.Fatal("Load(missing) succeeded")
		}
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
			t.Errorf("Load(missing) = %v, want fs.ErrNotExist naming %s", err, missing)
		}
	})
}

// TestRepoConfig loads the couchrep.ini that `make run` uses.
func TestRepoConfig(t *testing.T) {
	t.Parallel()
	c, err := Load(filepath.Join("..", "..", "couchrep.ini"))
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("no couchrep.ini at the repository root")
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(c.Ignored) != 0 {
		t.Errorf("couchrep.ini sets ignored keys: %+v", c.Ignored)
	}
	if c.Couchrep.HTTPBind != "127.0.0.1:5986" || c.Couchrep.AdminBind != "127.0.0.1:5987" {
		t.Errorf("binds = %s, %s; want 127.0.0.1:5986 and 127.0.0.1:5987", c.Couchrep.HTTPBind, c.Couchrep.AdminBind)
	}
	d := Default()
	d.origin, c.origin = nil, nil
	c.Couchrep.Watch = nil // the sample may list a local CouchDB
	if !reflect.DeepEqual(c.Replicator, d.Replicator) {
		t.Errorf("couchrep.ini's [replicator] differs from CouchDB's defaults:\n got %+v\nwant %+v", c.Replicator, d.Replicator)
	}
}

func TestEnv(t *testing.T) {
	t.Parallel()
	base := func(t *testing.T) Config {
		c, err := Parse("t.ini", strings.NewReader("[replicator]\nmax_jobs = 100\n[replicator.shares]\na/_replicator = 5\n"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	t.Run("overrides file", func(t *testing.T) {
		c := base(t)
		err := c.ApplyEnv([]string{
			"PATH=/usr/bin",
			"COUCHREP_REPLICATOR_MAX_JOBS=200",
			"COUCHREP_COUCHREP_NODE_NAME=n1@host",
			"COUCHREP_COUCHREP_HTTP_BIND=127.0.0.1:0",
			"COUCHREP_LOG_LEVEL=debug",
			"COUCHREP_ADMIN_TOKEN=s3cret",
			"COUCHREP_COUCHDB_UUID=abc",
			"COUCHREP_REPLICATOR_SHARES=b/_replicator=7, _replicator=9",
			"COUCHREP_ADMINS=root=pw",
			"COUCHREP_REPLICATOR_INTERVAL=",            // empty: ignored
			"COUCHREP_SOMETHING_ELSE=belongs to tests", // not a section: ignored
			"COUCHREP_UNRELATED",                       // no "=": ignored
		})
		if err != nil {
			t.Fatal(err)
		}
		checks := []struct {
			name      string
			got, want any
		}{
			{"max_jobs", c.Replicator.MaxJobs, 200},
			{"node_name", c.Couchrep.NodeName, "n1@host"},
			{"http_bind", c.Couchrep.HTTPBind, "127.0.0.1:0"},
			{"level", c.Log.Level, "debug"},
			{"token", c.Admin.Token, "s3cret"},
			{"uuid", c.CouchDB.UUID, "abc"},
			{"shares", c.Shares, map[string]int{"a/_replicator": 5, "b/_replicator": 7, "_replicator": 9}},
			{"admins", c.Admins, map[string]string{"root": "pw"}},
			{"interval", c.Replicator.Interval, time.Minute},
		}
		for _, tc := range checks {
			if !reflect.DeepEqual(tc.got, tc.want) {
				t.Errorf("%s = %#v, want %#v", tc.name, tc.got, tc.want)
			}
		}
	})
	t.Run("errors", func(t *testing.T) {
		tests := []struct{ env, msg string }{
			{"COUCHREP_REPLICATOR_MAX_JOBS=abc", `env COUCHREP_REPLICATOR_MAX_JOBS: [replicator] max_jobs: expected a non-negative integer, got "abc"`},
			{"COUCHREP_REPLICATOR_MAXJOBS=5", `env COUCHREP_REPLICATOR_MAXJOBS: [replicator] maxjobs: expected a known [replicator] key (did you mean "max_jobs"?)`},
			{"COUCHREP_REPLICATOR_SHARES=x/_replicator=0", `env COUCHREP_REPLICATOR_SHARES: [replicator.shares] x/_replicator: expected an integer from 1 to 1000, got "0"`},
			{"COUCHREP_REPLICATOR_SHARES=oops", `env COUCHREP_REPLICATOR_SHARES: [replicator.shares]: expected name=value pairs separated by commas, got "oops"`},
			{"COUCHREP_ADMINS=root=", `env COUCHREP_ADMINS: [admins]: expected name=value pairs`},
		}
		for _, tc := range tests {
			c := base(t)
			err := c.ApplyEnv([]string{tc.env})
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("ApplyEnv(%s) = %v, want ErrInvalid containing %s", tc.env, err, tc.msg)
			}
		}
	})
	t.Run("does not mutate copies", func(t *testing.T) {
		c := base(t)
		orig := c
		if err := c.ApplyEnv([]string{"COUCHREP_REPLICATOR_SHARES=a/_replicator=6"}); err != nil {
			t.Fatal(err)
		}
		if orig.Shares["a/_replicator"] != 5 || c.Shares["a/_replicator"] != 6 {
			t.Errorf("shares: original %v, copy %v; want 5 and 6", orig.Shares, c.Shares)
		}
	})
}

// TestPrecedence runs couchrepd's sequence: defaults < file < env < flags.
func TestPrecedence(t *testing.T) {
	t.Parallel()
	const ini = "[couchrep]\nhttp_bind = 127.0.0.1:1001\nadmin_bind = 127.0.0.1:2001\nnode_name = from-file\ndata_dir = /file\n" +
		"[log]\nlevel = error\n"
	env := []string{
		"COUCHREP_COUCHREP_HTTP_BIND=127.0.0.1:1002",
		"COUCHREP_COUCHREP_ADMIN_BIND=127.0.0.1:2002",
		"COUCHREP_LOG_LEVEL=warn",
	}
	args := []string{"--http", "127.0.0.1:1003", "--log-level=debug", "--store", "/s.db"}

	c, err := Parse("t.ini", strings.NewReader(ini))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyEnv(env); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("couchrepd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	checks := []struct{ name, got, want string }{
		{"http_bind (flag over env over file)", c.Couchrep.HTTPBind, "127.0.0.1:1003"},
		{"admin_bind (env over file)", c.Couchrep.AdminBind, "127.0.0.1:2002"},
		{"node_name (file over default)", c.Couchrep.NodeName, "from-file"},
		{"level (flag)", c.Log.Level, "debug"},
		{"store (flag over default)", c.StorePath(), "/s.db"},
		{"data_dir (file)", c.Couchrep.DataDir, "/file"},
		{"format (default)", c.Log.Format, "auto"},
	}
	for _, tc := range checks {
		if tc.got != tc.want {
			t.Errorf("%s = %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
}

func TestFlags(t *testing.T) {
	t.Parallel()
	t.Run("invalid value", func(t *testing.T) {
		c := Default()
		fs := flag.NewFlagSet("couchrepd", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs)
		err := fs.Parse([]string{"--http", "nowhere"})
		want := `invalid value "nowhere" for flag -http: [couchrep] http_bind: expected host:port such as "127.0.0.1:5986", got "nowhere"`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse = %v, want it to contain %s", err, want)
		}
	})
	t.Run("Validate names the flag", func(t *testing.T) {
		c := Default()
		fs := flag.NewFlagSet("couchrepd", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs)
		if err := fs.Parse([]string{"--admin", "127.0.0.1:5986"}); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		want := `flag --admin: [couchrep] admin_bind: expected an address other than http_bind, got "127.0.0.1:5986"`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to contain %s", err, want)
		}
	})
	t.Run("defaults shown", func(t *testing.T) {
		c := Default()
		fs := flag.NewFlagSet("couchrepd", flag.ContinueOnError)
		var out strings.Builder
		fs.SetOutput(&out)
		c.RegisterFlags(fs)
		fs.PrintDefaults()
		for _, want := range []string{"-http address", "(default 127.0.0.1:5986)", "-admin address", "-data directory", "-node-name name", "-store file", "-log-level level", "-log-format format", "-node-types types"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("usage lacks %q:\n%s", want, out.String())
			}
		}
	})
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		ini    string
		modify func(*Config)
		msg    string
	}{
		{"set in Go", "", func(c *Config) { c.Replicator.WorkerProcesses = 0 },
			`[replicator] worker_processes: expected a positive integer, got "0"`},
		{"duration set in Go", "", func(c *Config) { c.Replicator.Interval = -time.Second },
			`[replicator] interval: expected a whole number of milliseconds (at least 1) or a duration such as "30s", got "-1000"`},
		{"share set in Go", "", func(c *Config) { c.Shares = map[string]int{"x/_replicator": 5000} },
			`[replicator.shares] x/_replicator: expected an integer from 1 to 1000, got "5000"`},
		{"empty node types", "", func(c *Config) { c.Couchrep.NodeTypes = nil },
			`[couchrep] node_types: expected a comma-separated list`},
		{"backoff order, from the file", "[replicator]\nmin_backoff_penalty_sec = 600\nmax_backoff_penalty_sec = 60\n", nil,
			`t.ini:3: [replicator] max_backoff_penalty_sec: expected at least min_backoff_penalty_sec (600), got "60"`},
		{"cert without key", "[replicator]\n\ncert_file = /c.pem\n", nil,
			`[replicator] key_file: expected cert_file and key_file set together, got ""`},
		{"same bind twice", "[couchrep]\nadmin_bind = 127.0.0.1:5986\n", nil,
			`t.ini:2: [couchrep] admin_bind: expected an address other than http_bind, got "127.0.0.1:5986"`},
		{"empty admin password", "", func(c *Config) { c.Admins = map[string]string{"root": ""} },
			`[admins] root: expected a non-empty password`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Parse("t.ini", strings.NewReader(tc.ini))
			if err != nil {
				t.Fatal(err)
			}
			if tc.modify != nil {
				tc.modify(&c)
			}
			err = c.Validate()
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Validate() = %v, want ErrInvalid containing\n  %s", err, tc.msg)
			}
		})
	}
	t.Run("ports 0 may repeat", func(t *testing.T) {
		c := Default()
		c.Couchrep.HTTPBind, c.Couchrep.AdminBind = "127.0.0.1:0", "127.0.0.1:0"
		if err := c.Validate(); err != nil {
			t.Error(err)
		}
	})
}

func TestEmptyValueRestoresDefault(t *testing.T) {
	t.Parallel()
	c, err := Parse("t.ini", strings.NewReader("[couchrep]\nnode_types =\nwatch =\n[replicator]\nrequest_timeout =\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	if !slices.Equal(c.Couchrep.NodeTypes, d.Couchrep.NodeTypes) || c.Couchrep.Watch != nil || c.Replicator.RequestTimeout != 0 {
		t.Errorf("got node_types %v, watch %v, request_timeout %v; want the defaults", c.Couchrep.NodeTypes, c.Couchrep.Watch, c.Replicator.RequestTimeout)
	}
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:5987": true, "[::1]:5987": true, "localhost:1": true, "127.1.2.3:9": true,
		"0.0.0.0:5987": false, ":5987": false, "10.0.0.1:5987": false, "[::]:1": false, "bad": false,
	} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"max_jobs", "max_jobs", 0}, {"max_jbos", "max_jobs", 2}, {"kitten", "sitting", 3}, {"", "abc", 3}} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// FuzzParse checks that Parse never panics, that every error it or
// Validate returns is an ErrInvalid, and that a parsed config's settings
// read back as they were written.
func FuzzParse(f *testing.F) {
	f.Add("[replicator]\nmax_jobs = 5\ninterval = 30s\n")
	f.Add("[replicator.shares]\nhigh/_replicator = 200\n[admins]\na = b\n")
	f.Add("[couchrep]\nwatch = http://a:1, https://b\nnode_types = replication\n")
	f.Add("\ufeff;c\n[log]\nlevel = none ; x\n[replicator\n")
	f.Add("[replicator]\nrequest_timeout = infinity\nmax_document_id_length = 0\n")
	f.Fuzz(func(t *testing.T, ini string) {
		c, err := Parse("f.ini", strings.NewReader(ini))
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse error is not ErrInvalid: %v", err)
			}
			joined, ok := err.(interface{ Unwrap() []error })
			if !ok {
				t.Fatalf("Parse error %T is not a joined list of *Error", err)
			}
			for _, e := range joined.Unwrap() {
				var ce *Error
				if !errors.As(e, &ce) || ce.Line < 1 || ce.Expected == "" || (ce.Section != "" && !slices.Contains(sections, ce.Section)) {
					t.Fatalf("malformed error %#v", e)
				}
			}
			return
		}
		if err := c.Validate(); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("Validate error is not ErrInvalid: %v", err)
		}
		// Round trip: writing each setting back and parsing it gives the
		// same typed value.
		for _, s := range schema {
			if s.ignored != "" {
				continue
			}
			text := s.v.get(&c)
			if text == "" {
				continue
			}
			var back Config
			back = Default()
			if !s.v.set(&back, text) {
				t.Fatalf("[%s] %s: %q (from Parse) does not parse back", s.section, s.key, text)
			}
			if got := s.v.get(&back); got != text {
				t.Fatalf("[%s] %s: round trip %q -> %q", s.section, s.key, text, got)
			}
		}
	})
}

func BenchmarkParse(b *testing.B) {
	data, err := os.ReadFile(filepath.Join("..", "..", "couchrep.ini"))
	if err != nil {
		b.Skip("no couchrep.ini:", err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("couchrep.ini", strings.NewReader(string(data))); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAdminPartyBeyondLoopback: as Apache CouchDB 3, an HTTP API other
// machines can reach needs [admins], unless allow_admin_party says
// otherwise; loopback is fine without.
func TestAdminPartyBeyondLoopback(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		bind    string
		admins  map[string]string
		allow   bool
		types   []string
		wantErr string
	}{
		{"loopback without admins", "127.0.0.1:5986", nil, false, nil, ""},
		{"all interfaces without admins", "0.0.0.0:5986", nil, false, nil, "[couchrep] http_bind: expected a loopback address while [admins] is empty"},
		{"all interfaces, message says what to set", ":5986", nil, false, nil, "set `[couchrep] allow_admin_party = true`"},
		{"all interfaces with admins", "0.0.0.0:5986", map[string]string{"admin": "pw"}, false, nil, ""},
		{"all interfaces, admin party allowed", "0.0.0.0:5986", nil, true, nil, ""},
		{"all interfaces with an auth server", "0.0.0.0:5986", nil, false, nil, ""},
		{"replication-only node serves no API", "0.0.0.0:5986", nil, false, []string{NodeTypeReplication}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.Couchrep.HTTPBind, c.Couchrep.AllowAdminParty = tc.bind, tc.allow
			if strings.Contains(tc.name, "auth server") {
				c.Couchrep.AuthServer = "http://127.0.0.1:5984"
			}
			if tc.admins != nil {
				c.Admins = tc.admins
			}
			if tc.types != nil {
				c.Couchrep.NodeTypes = tc.types
			}
			err := c.Validate()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestHashAdmins: plain [admins] passwords are replaced by their hash in
// memory and in the file that set them, which keeps every other byte;
// hashes and passwords from the environment stay out of the file.
func TestHashAdmins(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "local.ini")
	orig := "; my config\n[replicator]\nmax_jobs = 10 ; keep\n\n[admins]\n; the admins\nalice = wonderland ; set by ops\nbob=-pbkdf2-abc,salt,10\n  carol =  two words  \r\n"
	if err := os.WriteFile(path, []byte(orig), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyEnv([]string{EnvAdmins + "=dave=fromenv"}); err != nil {
		t.Fatal(err)
	}
	hash := func(p string) (string, error) { return "-pbkdf2-" + strings.ReplaceAll(p, " ", "_") + ",s,1", nil }
	names, files, err := c.HashAdmins(hash)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, ",") != "alice,carol,dave" || len(files) != 1 || files[0] != path {
		t.Fatalf("hashed %v in %v", names, files)
	}
	want := strings.Replace(strings.Replace(orig, "alice = wonderland ; set by ops", "alice = -pbkdf2-wonderland,s,1 ; set by ops", 1),
		"  carol =  two words  \r", "  carol =  -pbkdf2-two_words,s,1\r", 1)
	got, _ := os.ReadFile(path)
	if string(got) != want {
		t.Fatalf("file after hashing:\n%q\nwant\n%q", got, want)
	}
	if c.Admins["dave"] != "-pbkdf2-fromenv,s,1" || c.Admins["bob"] != "-pbkdf2-abc,salt,10" {
		t.Fatalf("admins in memory: %v", c.Admins)
	}
	again, err := Load(path)
	if err != nil || again.Admins["alice"] != "-pbkdf2-wonderland,s,1" || again.Admins["carol"] != "-pbkdf2-two_words,s,1" {
		t.Fatalf("reloaded: %v, %v", again.Admins, err)
	}
	if names, files, _ := again.HashAdmins(hash); len(names) != 0 || len(files) != 0 {
		t.Fatalf("second start hashed %v in %v again", names, files)
	}
}

// TestUsersAuthServer: auth_server wins; the first watched server is the
// default only once [admins] is set (no [admins] and no auth_server is an
// admin party).
func TestUsersAuthServer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		authServer string
		watch      []string
		admins     map[string]string
		want       string
	}{
		{"admin party", "", []string{"http://a:5984"}, nil, ""},
		{"admins, no watch", "", nil, map[string]string{"admin": "pw"}, ""},
		{"admins and watch", "", []string{"http://a:5984", "http://b:5984"}, map[string]string{"admin": "pw"}, "http://a:5984"},
		{"explicit", "http://c:5984", []string{"http://a:5984"}, nil, "http://c:5984"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.Couchrep.AuthServer, c.Couchrep.Watch = tc.authServer, tc.watch
			if tc.admins != nil {
				c.Admins = tc.admins
			}
			if got := c.UsersAuthServer(); got != tc.want {
				t.Errorf("UsersAuthServer() = %q, want %q", got, tc.want)
			}
		})
	}
}
