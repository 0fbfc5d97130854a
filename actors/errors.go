package actors

import "errors"

// Sentinel errors of admin requests, whichever actor answers them; the root
// package exports the same values (couchrep.ErrJobNotFound, ...) and maps
// them to the admin protocol's codes. These are about the request itself;
// the next ones about the job it names.
var (
	// ErrUnknownActor: the request names an actor the node does not have.
	ErrUnknownActor = errors.New("couchrep: unknown actor")
	// ErrUnknownRequest: no actor handles the message type.
	ErrUnknownRequest = errors.New("couchrep: unknown request type")
	// ErrStopped: the node has stopped.
	ErrStopped = errors.New("couchrep: node stopped")
	// ErrInvalidRequest: the request's fields are wrong (an invalid
	// replication, max_jobs 0, ...).
	ErrInvalidRequest = errors.New("couchrep: invalid request")
)

// Sentinel errors of admin requests about the job they name.
var (
	// ErrJobNotFound: no job has that job id or replication id.
	ErrJobNotFound = errors.New("couchrep: job not found")
	// ErrJobNotRunning: stopping a job that is not running.
	ErrJobNotRunning = errors.New("couchrep: job not running")
	// ErrJobElsewhere: the job runs on another node that cannot carry out
	// the request (it is not alive, or did not act in time); the error
	// names that node.
	ErrJobElsewhere = errors.New("couchrep: job runs on another node")
	// ErrJobFollowsDocument: canceling the job of a _replicator document,
	// which only its document ends (deleted or changed), as in CouchDB.
	ErrJobFollowsDocument = errors.New("couchrep: the job of a _replicator document follows its document")
)
