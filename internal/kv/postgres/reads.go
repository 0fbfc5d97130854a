package postgres

import (
	"context"
	"fmt"
	"slices"
)

// The read connection.
//
// A transaction's first point read runs as a statement of its own
// (tx.autoRead), with no transaction to keep open around it, so it does
// not need a connection of the pool: the first reads of all the DB's
// transactions go on one pipelined connection (pipe.go), batched like
// commits, each a statement with its own snapshot (READ COMMITTED: every
// statement takes one) whose commit version it returns. One server process
// then serves a busy DB's reads back to back instead of one per worker,
// each woken for every read (about 90 of the ~115 us of server CPU each
// such read cost).

// maxReadsInFlight is how many read batches of one DB may be in flight.
const maxReadsInFlight = 2

// pointRead is one read on the read connection: its key and, once done
// is closed, the statement's commit version, the row (if found) and its
// version, or err.
type pointRead struct {
	key  []byte
	done chan struct{}

	snap  int64
	found bool
	v     []byte
	ver   int64
	err   error
}

// readPoint reads key on the read connection.
func (db *DB) readPoint(ctx context.Context, key []byte) (*pointRead, error) {
	r := &pointRead{key: slices.Clone(key), done: make(chan struct{})} // it may outlive a cancelled caller
	db.readQ.add(r)
	db.sendReads()
	select {
	case <-r.done:
		return r, r.err
	case <-ctx.Done():
		return nil, ctx.Err() // the read completes unseen
	}
}

// sendReads sends the queued reads (up to maxBatch) as one batch unless
// maxReadsInFlight batches are in flight.
func (db *DB) sendReads() {
	batch := db.readQ.take(maxReadsInFlight, 1)
	if batch == nil {
		return
	}

	b := &sentBatch{calls: make([]call, len(batch))}
	for i, r := range batch {
		b.calls[i] = call{sql: autoGetSQL, args: []any{r.key}, row: r.take}
	}
	b.deliver = func(_ int64, err error) {
		db.readQ.ended()
		db.sendReads()
		for _, r := range batch {
			if err != nil {
				r.err = db.errorf(fmt.Sprintf("get %x", r.key), err)
			}
			close(r.done)
		}
	}
	if err := db.reads.write(db, b); err != nil {
		b.deliver(0, err)
	}
}

// take takes the read's row (autoGetSQL's: the commit version, then the
// key, value and version of the row found, NULL if none).
func (r *pointRead) take(vals [][]byte) (err error) {
	if r.snap, err = decodeInt8(vals[0]); err != nil || vals[1] == nil {
		return err
	}
	if r.ver, err = decodeInt8(vals[3]); err != nil {
		return err
	}
	r.found, r.v = true, slices.Clone(vals[2])
	if r.v == nil {
		r.v = []byte{}
	}
	return nil
}
