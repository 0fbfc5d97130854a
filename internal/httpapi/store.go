package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
)

// ErrNotFound is what a Store returns (wrapped or not) for a job that does
// not exist.
var ErrNotFound = errors.New("httpapi: job not found")

// ErrOtherUser is wrapped by Store.AddTransient's error when another
// user's live job runs the replication and the caller is not an admin.
var ErrOtherUser = errors.New("httpapi: another user's job runs this replication")

// Job is one replication job as the API shows it: the store's record
// translated into plain fields.
type Job struct {
	// JobID is the store's job id (derived without network calls).
	JobID string
	// RepID is CouchDB's replication id, base + extension ("+continuous");
	// empty until the job computed it.
	RepID string
	// Transient is true for POST /_replicate jobs, false for jobs of
	// _replicator documents.
	Transient bool
	// Server is the CouchDB server whose _replicator database holds a
	// persistent job's document: its URL without credentials (ServerName).
	Server string
	// Database and DocID locate a persistent job's document.
	Database, DocID string
	// User created the job.
	User string
	// Source and Target are the endpoint URLs (credentials are redacted
	// again before they are shown).
	Source, Target string
	// SourceProxy and TargetProxy are the proxy URLs, empty for none.
	SourceProxy, TargetProxy string
	// State is the job's state.
	State repjob.State
	// Continuous replications run until cancelled.
	Continuous bool
	// CheckpointInterval is the job's checkpoint_interval.
	CheckpointInterval time.Duration
	// History is the scheduler history, newest first.
	History schedpolicy.History
	// LastError is why the job last crashed or failed.
	LastError string
	// ErrorCount counts consecutive crashes.
	ErrorCount int
	// Stats are the job's stored stats (repjob.Stats names them); nil
	// before its first run.
	Stats *messages.ReplicationStats
	// Node runs (or last ran) the job.
	Node string
	// CreatedAt, LastUpdated, LastStarted and FinishedAt are zero when
	// unknown.
	CreatedAt, LastUpdated, LastStarted, FinishedAt time.Time
	// ParkedSince is when the running job parked (idle, its feed closed,
	// waiting for its source to change); zero while it replicates.
	ParkedSince time.Time
	// PausedAt is when an operator paused the job (couchrepctl job
	// pause); zero unless paused. ResetAt is set while its next run starts
	// from sequence 0 (job reset).
	PausedAt, ResetAt time.Time
	// Result is CouchDB's POST /_replicate reply of a completed one-shot
	// replication.
	Result json.RawMessage
	// FromDoc is the _scheduler/docs entry read from a document that
	// already carried its terminal state when the doc processor read it
	// (JSON object: source, target, info, error_count, start_time,
	// last_updated); empty for a job couchrep ran.
	FromDoc json.RawMessage
}

// Store is what the API needs from the replication job store.
type Store interface {
	// AddTransient adds the transient replication described by body (a
	// valid POST /_replicate body) for user and returns the job as stored
	// (no second read). Adding a replication identical to a pending or
	// running one is a no-op that returns the existing job. When a live
	// job of another user owns the same replication id, a user who is not
	// an admin gets an error wrapping ErrOtherUser (CouchDB's 401 "You
	// are not a server admin.") and nothing changes; an admin's replaces
	// another user's transient job.
	AddTransient(ctx context.Context, body []byte, user string, admin bool) (*Job, error)
	// TransientJobID derives, without network calls, the job id
	// AddTransient gives body and user.
	TransientJobID(body []byte, user string) (string, error)
	// Get returns the job with id jobID, or an error wrapping ErrNotFound.
	Get(ctx context.Context, jobID string) (*Job, error)
	// FindByRepID returns the job owning replication id repID, or an
	// error wrapping ErrNotFound.
	FindByRepID(ctx context.Context, repID string) (*Job, error)
	// List returns every job, in no particular order.
	List(ctx context.Context) ([]*Job, error)
	// SchedulerJobs returns the jobs _scheduler/jobs lists (every job not
	// finished) in its order (the shown id: replication id once known,
	// else job id), from the skip-th on, at most limit (negative: no
	// limit), and how many there are.
	SchedulerJobs(ctx context.Context, skip, limit int) (jobs []*Job, total int, err error)
	// SchedulerDocs returns the jobs of _replicator documents (of
	// database db, or all when db is empty) in _scheduler/docs order
	// (database, document id), from the skip-th on, at most limit
	// (negative: no limit), and how many there are.
	SchedulerDocs(ctx context.Context, db string, skip, limit int) (jobs []*Job, total int, err error)
	// SchedulerDoc returns the job of document docID in database db, or
	// an error wrapping ErrNotFound.
	SchedulerDoc(ctx context.Context, db, docID string) (*Job, error)
	// Remove deletes a job, stopping it if it runs.
	Remove(ctx context.Context, jobID string) error
	// Wait blocks until done returns true for the job's current state (it is
	// first called at once), and returns that state. It returns an error
	// wrapping ErrNotFound if the job is removed meanwhile, and ctx's error
	// when ctx ends.
	Wait(ctx context.Context, jobID string, done func(*Job) bool) (*Job, error)
}
