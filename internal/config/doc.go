// Package config reads couchrep's configuration: a CouchDB-style ini file,
// then COUCHREP_* environment variables, then command-line flags, over
// defaults that equal CouchDB's wherever CouchDB has the key.
//
// # Precedence
//
// defaults (Default) < file (Load, Parse) < environment (ApplyEnv) < flags
// (RegisterFlags). couchrepd loads the file, applies the environment,
// registers the flags on the loaded Config and parses the command line,
// then calls Validate. Complete fills what is derived from the data
// directory (store path, server UUID, node name).
//
// # Sections
//
//	[couchrep]            couchrep's own: store, data_dir, node_name, node_types,
//	                      http_bind, admin_bind, watch, durability,
//	                      allow_admin_party (an open API beyond loopback),
//	                      auth_server, session_timeout, auth_cache_ttl (CouchDB
//	                      users on the HTTP API: Config.UsersAuthServer)
//	[replicator]          CouchDB's keys, names and defaults (max_jobs = 500, ...),
//	                      plus couchrep's limits on what endpoints send:
//	                      max_document_bytes, max_changes_row_bytes, max_response_bytes
//	[replicator.shares]   <_replicator db> = <shares 1..1000>, default 100
//	[couchdb]             uuid: the server UUID used in replication IDs
//	[log]                 level (CouchDB's names), format (auto, json, console)
//	[admin]               token: the admin endpoint's secret
//	[ssl]                 enable, cert_file, key_file: the HTTP API over TLS, as CouchDB
//	[admins]              <user> = <password>: HTTP API admins, as in CouchDB
//	                      (plain passwords are hashed on start: HashAdmins)
//
// Unknown sections and keys are errors, except a few CouchDB [replicator]
// and [log] keys that mean nothing to a Go replicator (valid_socket_options,
// ibrowse_options, cluster_quiet_period, writer, file, ...):
// those are accepted and listed in Config.Ignored so that a section copied
// from CouchDB's local.ini loads, and the daemon can warn about them.
//
// # Syntax
//
// CouchDB's: "[section]" headers; "key = value"; lines starting with ";"
// (or "#") are comments; " ;" after a value starts a comment. An empty value
// means the default (in CouchDB it deletes the key). A section may appear
// several times; a key may be set only once per file. Continuation lines
// are not supported.
//
// # Values and units
//
// Integers are decimal; booleans are exactly "true" or "false"; lists are
// comma-separated. Times are time.Duration fields; in the file and
// environment a plain integer is in CouchDB's unit for that key — interval,
// startup_jitter, connection_timeout, checkpoint_interval,
// connection_close_interval, request_timeout and missing_doc_retry_msec in
// milliseconds; health_threshold, cluster_start_period, the *_sec keys and
// session_min_update_interval in seconds; cacert_reload_interval_hours in
// hours — so a CouchDB config means the same here. A Go duration string with
// an explicit unit ("30s", "1m30s", "250ms") is accepted for any time key.
// request_timeout and max_document_id_length also take "infinity" (CouchDB's
// default), which is 0 in Go.
//
// Where CouchDB accepts nonsense couchrep refuses it: worker_processes 0,
// shares outside 1..1000 (CouchDB clamps silently), a shares key that is not
// a _replicator database, usage_coeff outside 0..1.
//
// The crash backoff follows CouchDB's couch_jobs-based replicator:
// min(min_backoff_penalty_sec * 2^errors, max_backoff_penalty_sec), 32 s to
// 2 days by default. Its other job-server keys (max_acceptors,
// min_run_time_sec, transient_job_max_age_sec, create_replicator_db) are
// here too, with its defaults except min_run_time_sec, which defaults to 0:
// the scheduler rotates jobs as CouchDB 3.x does (see Replicator.MinRunTime).
//
// # Environment
//
// COUCHREP_<SECTION>_<KEY> in upper case, "." and "-" written "_":
// COUCHREP_COUCHREP_NODE_NAME, COUCHREP_COUCHREP_HTTP_BIND,
// COUCHREP_REPLICATOR_MAX_JOBS, COUCHREP_LOG_LEVEL, COUCHREP_ADMIN_TOKEN,
// COUCHREP_COUCHDB_UUID. The map sections take comma-separated name=value
// pairs: COUCHREP_REPLICATOR_SHARES="high/_replicator=200" and
// COUCHREP_ADMINS="admin=secret". See ApplyEnv.
//
// # Flags
//
// --data, --store, --http, --admin, --node-name, --node-types, --log-level,
// --log-format (RegisterFlags). The command itself owns --config.
//
// # Derived defaults
//
// store defaults to <data_dir>/couchrep.db (StorePath). The server UUID,
// when [couchdb] uuid is not set, is generated once and kept in
// <data_dir>/couchdb_uuid (EnsureUUID). The node name, when not set, is
// couchrep-<8 hex digits>@<short hostname>, the digits generated once and
// kept in <data_dir>/node_id (EnsureNodeName): unique per data directory,
// stable across restarts.
//
// # Errors
//
// Every invalid setting is an *Error wrapping ErrInvalid whose message names
// the file and line (or variable or flag), the section and key, what was
// expected and what was found:
//
//	couchrep.ini:12: [replicator] max_jobs: expected a non-negative integer, got "abc"
//
// Parse reports up to 20 such errors at once, joined.
package config
