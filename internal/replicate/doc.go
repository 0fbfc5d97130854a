// Package replicate implements Apache CouchDB's replication algorithm:
// replication ids (version 4, byte-compatible with CouchDB so that both find
// each other's checkpoints), checkpoint documents and history comparison,
// and the replication engine itself (one changes reader feeding
// worker_processes workers that run _revs_diff, fetch missing revisions and
// write them with new_edits=false), with CouchDB's options, defaults and
// _active_tasks statistics.
//
// The engine is context-driven and has no actors inside: New builds a
// Replication from Params and Options, Run executes it until it completes
// (one-shot) or its context is cancelled (continuous).
package replicate
