package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// uuidKey is where the store records the server UUID of the nodes sharing it.
var uuidKey = tuple.Tuple{"couchrep", "server_uuid"}.Pack()

// ErrUUIDMismatch is returned (as a *UUIDMismatchError) by SharedUUID for
// a configured server uuid that is not the one recorded.
var ErrUUIDMismatch = errors.New("cluster: configured server uuid differs from the recorded one")

// UUIDMismatchError is SharedUUID's refusal of a configured uuid.
type UUIDMismatchError struct {
	// Configured is the node's [couchdb] uuid; Recorded the one in
	// RecordedIn ("the job store" or "the data directory").
	Configured, Recorded, RecordedIn string
}

func (e *UUIDMismatchError) Error() string {
	return fmt.Sprintf("[couchdb] uuid is %q but %s records server uuid %q: replication ids are computed from it, so every job would restart from zero under another one. "+
		"To keep the jobs' checkpoints, remove [couchdb] uuid (or set it to %q); to replace the recorded uuid on purpose, start once with --adopt-uuid %s (the embedding API: CouchDB.Adopted), which lists the jobs that will restart from zero",
		e.Configured, e.RecordedIn, e.Recorded, e.Recorded, e.Configured)
}

func (e *UUIDMismatchError) Unwrap() error { return ErrUUIDMismatch }

// UUIDRequest is what a starting node knows about its server uuid.
type UUIDRequest struct {
	// UUID is the node's uuid: configured ([couchdb] uuid), generated
	// into the data directory, or adopted.
	UUID string
	// Generated: UUID was generated, not configured; a uuid recorded in
	// the store wins over it (a new node joins its store's uuid).
	Generated bool
	// Adopted: UUID was asked for explicitly (couchrepd --adopt-uuid) and
	// replaces the recorded one.
	Adopted bool
	// DataDir is the uuid recorded in the node's data directory, if any,
	// for a configured UUID: it counts as recorded when the store has none.
	DataDir string
}

// UUIDResult is what SharedUUID decided.
type UUIDResult struct {
	// UUID is the server uuid the node uses.
	UUID string
	// Replaced is the uuid the store recorded before an adopted one
	// replaced it ("" when nothing changed): the jobs' replication ids
	// change with it.
	Replaced string
}

// SharedUUID returns the server UUID a node uses in replication ids. Every
// node sharing a store must use the same one, or a job moving between nodes
// would not find its checkpoints: the first node records its UUID in the
// store and later nodes whose UUID was generated (not configured) adopt it.
// A configured UUID that differs from the recorded one (the store's, else
// the data directory's) is refused with a *UUIDMismatchError: a uuid change
// makes every job start again from zero, so it is made only on purpose, by
// an adopted UUID (couchrepd --adopt-uuid), which replaces the recorded one
// and says so in UUIDResult.Replaced.
func SharedUUID(ctx context.Context, db kv.Database, req UUIDRequest) (UUIDResult, error) {
	var out UUIDResult
	err := db.Transact(ctx, func(tx kv.Tx) error {
		out = UUIDResult{UUID: req.UUID}
		got, err := tx.Get(uuidKey)
		if err != nil {
			return err
		}
		recorded := string(got)
		switch {
		case req.UUID == "":
			out.UUID = recorded
			return nil
		case req.Adopted:
			if got != nil && recorded != req.UUID {
				out.Replaced = recorded
			}
		case req.Generated:
			if got != nil {
				out.UUID = recorded
				return nil
			}
		default:
			where := "the job store"
			if got == nil && req.DataDir != "" {
				recorded, where = req.DataDir, "the data directory"
			}
			if recorded != "" && recorded != req.UUID {
				return &UUIDMismatchError{Configured: req.UUID, Recorded: recorded, RecordedIn: where}
			}
		}
		if string(got) != req.UUID {
			tx.Set(uuidKey, []byte(req.UUID))
		}
		return nil
	})
	if err != nil {
		return UUIDResult{}, fmt.Errorf("couchrep: server uuid in the job store: %w", err)
	}
	return out, nil
}
