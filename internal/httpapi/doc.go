// Package httpapi is couchrep's HTTP API in Apache CouchDB's shapes, so that
// tools and dashboards written for CouchDB's replicator work unchanged:
//
//	POST /_replicate                      start a transient replication, or cancel one
//	GET  /_scheduler/jobs[/{id}]          replication jobs (pending, running, crashing)
//	GET  /_scheduler/docs[/{db}[/{doc}]]  jobs of _replicator documents, all states
//	GET  /_active_tasks                   running replications with their stats
//	GET  /                                CouchDB's welcome document
//	GET  /_status                         the status page (GET /_status/data: its JSON)
//	GET  /_up                             liveness
//	GET  /metrics                         Prometheus metrics
//	POST/GET/DELETE /_session             CouchDB's cookie login, who am I, logout
//
// Errors are CouchDB's {"error": ..., "reason": ...} objects with CouchDB's
// status codes. Parameters are validated once, by
// replication.ParseReplicateRequest, whose errors name the field.
//
// The handler knows nothing of actors or of the store's layout: it reads and
// writes jobs through the Store interface (the node gives it
// internal/repjob's store) and reports what it sees to Metrics. Credentials
// are never shown: endpoint URLs and error texts pass through redact.URL /
// redact.Text (the one redaction home) before they are written to a response or a log.
//
// Authentication is CouchDB's basic auth against the [admins] section
// (plain passwords or CouchDB's "-pbkdf2-" and "-hashed-" hashes;
// HashPassword makes the hash couchrepd writes on start) and, with an auth
// server (UsersOptions), the users of a CouchDB server: their Basic
// credentials or CouchDB cookie are checked with its GET /_session (the
// answer cached briefly under an HMAC of the credentials), and couchrep's
// own AuthSession cookie of POST /_session is signed with a secret shared
// through the job store. A request acts as a UserCtx (name, roles; _admin
// is a server admin) and is refused where CouchDB 3.4.3 refuses it, with
// its answers (authorize, mayControl). Failed logins, /_session's too, are
// rate-limited per client address (429 beyond AuthFailureBurst). With no
// admins and no auth server the API is open ("admin party"; the node
// refuses that beyond loopback unless allowed). GET /_up, GET / and the status page's
// script and style sheet are always open; the page and its data need the
// same auth as the API. Request bodies are checked before decoding (UTF-8,
// syntax, depth, duplicate keys, an object) with reasons that say exactly
// what is wrong.
//
// The status page (status.go, statuspage/) is plain HTML, CSS and JavaScript
// embedded in the binary: no build step, no CDN. Its script polls
// /_status/data and writes every string through textContent, never as
// markup; a Content-Security-Policy forbids inline script besides.
package httpapi
