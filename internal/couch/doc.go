// Package couch is couchrep's HTTP client for CouchDB-protocol databases
// (Apache CouchDB, PouchDB Server, Cloudant, Couchbase Sync Gateway): the
// requests CouchDB's replicator makes, and nothing else.
//
// A DB is one database endpoint (URL, headers, basic-auth credentials). Its
// methods map one-to-one onto the protocol steps: Info and ServerInfo,
// Create, Changes (normal, longpoll and continuous feeds, decoded as a
// stream so memory does not grow with the feed), RevsDiff, BulkGet with its
// fallback OpenRevs (JSON or multipart/mixed), BulkDocs and PutDoc
// (multipart/related for attachments) with new_edits=false, _local
// documents and EnsureFullCommit.
//
// Requests are retried as CouchDB's replicator retries them: 408, 5xx and
// connection errors up to Options.Retries times with exponential backoff
// starting at Options.RetryBackoff (250 ms); a 429 is reported to the
// Options.Limiter and retried without using up a retry. Errors name the
// method, the URL without credentials, the status and CouchDB's error and
// reason; *HTTPError matches the package's sentinel errors with errors.Is.
//
// Sequences are opaque (Seq): a JSON number on PouchDB Server, a string on
// CouchDB 2+. They are passed back to the server exactly as received.
package couch
