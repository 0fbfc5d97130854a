package sqlite

import (
	"errors"
	"fmt"

	"github.com/couchrep/couchrep/internal/kv"
)

// Reads through the writer connection.
//
// A pooled reader connection is a poor place for short transactions while
// commits keep coming: each read transaction that starts after a commit
// finds SQLite's page cache emptied and reloads every page it touches.
// The writer connection's cache stays warm (its own commits keep it
// current), so a transaction first reads through it, one statement at a
// time under DB.wmu, outside any write transaction: each statement sees
// the latest commit.
//
// The reads of one transaction must all see one state. DB.wgen names the
// writer connection's view; it changes with each of our write
// transactions and whenever SQLite notices another process's commit
// (SQLITE_FCNTL_DATA_VERSION). A transaction notes the generation of its
// first read; a later read in another generation still sees one
// consistent state if every commit in between was ours (DB.own knows what
// each wrote) and none wrote a key or range the transaction has read,
// snapshot reads included: then the earlier reads hold in the newer state
// too and the transaction moves to it. Otherwise the read fails, the
// attempt is void (errMoved, whatever fn makes of it), and the next
// attempt reads from a reader connection's snapshot as before.
//
// Validation is unchanged: snapVersion, noted before the first read, is a
// lower bound of the version the reads saw.

// errMoved: a transaction's reads through the writer connection could not
// go on in one consistent state. Transact and ReadTransact run the
// transaction again on a reader snapshot.
var errMoved = fmt.Errorf("%w: the store changed during the transaction's reads", kv.ErrConflict)

// read runs f on the statements of t's snapshot: the writer connection's
// (under DB.wmu) or, for a classic attempt, a reader's.
func (t *tx) read(f func(s stmts) error) error {
	if t.classic {
		r, err := t.snapshot()
		if err != nil {
			return err
		}
		return f(r.stmts)
	}
	if t.moved {
		return errMoved
	}
	db := t.db
	if t.wgen == 0 {
		t.snapVersion = db.committed.Load()
	}
	db.wmu.Lock()
	defer db.wmu.Unlock()
	if db.wclosed {
		return kv.ErrClosed
	}
	if err := f(db.writer.stmts); err != nil {
		return err
	}
	if dv := db.writer.conn.dataVersion(); dv != db.wdv {
		// Another process committed; SQLite noticed while running f.
		db.wgen++
		db.wver, db.wdv = -1, dv
	}
	switch {
	case t.wgen == 0:
		t.wgen, t.wver = db.wgen, db.wver
	case t.wgen == db.wgen:
	case t.canAdvance():
		t.wgen, t.wver = db.wgen, db.wver
	default:
		t.moved = true
		t.Fail(errMoved)
		return errMoved
	}
	return nil
}

// canAdvance reports whether t's reads so far hold unchanged in the
// writer connection's current view. Called under DB.wmu.
func (t *tx) canAdvance() bool {
	db := t.db
	if t.wver < 0 || db.wver < t.wver || db.wver-t.wver > ownLogCap {
		return false
	}
	for v := t.wver + 1; v <= db.wver; v++ {
		w, mine := db.own.byVersion[v]
		if !mine {
			return false
		}
		if readSetTouched(t.points, t.ranges, w) || readSetTouched(t.snapPoints, t.snapRanges, w) {
			return false
		}
	}
	return true
}

// isMoved reports whether the attempt t failed because its reads moved.
func isMoved(t *tx, err error) bool { return t.moved || errors.Is(err, errMoved) }
