package sqlite

import (
	"fmt"

	"github.com/couchrep/couchrep/internal/kv/kvbuf"
)

const (
	qGet       = "SELECT v FROM kv WHERE k = ?"
	qRangeFwd  = "SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k LIMIT ?"
	qRangeRev  = "SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k DESC LIMIT ?"
	qGetCommit = "SELECT value FROM meta WHERE name = 'commit'"
)

// stmts are the read statements every connection prepares.
type stmts struct {
	get, fwd, rev   *cstmt
	begin, rollback *cstmt // BEGIN (deferred) and ROLLBACK
}

func prepareReads(c *cconn) (stmts, error) {
	var s stmts
	var err error
	for _, p := range []struct {
		dst **cstmt
		q   string
	}{
		{&s.get, qGet}, {&s.fwd, qRangeFwd}, {&s.rev, qRangeRev},
		{&s.begin, "BEGIN"}, {&s.rollback, "ROLLBACK"},
	} {
		if *p.dst, err = c.prepare(p.q); err != nil {
			return s, err
		}
	}
	return s, nil
}

// getValue reads one key: (nil, false) if absent; a present empty value is
// returned as a non-nil empty slice.
func (s stmts) getValue(key []byte) ([]byte, bool, error) {
	st := s.get
	if err := st.bind([][]byte{key}); err != nil {
		return nil, false, err
	}
	defer st.reset()
	row, err := st.step()
	if err != nil || !row {
		return nil, false, err
	}
	return st.blob(0), true, nil
}

// page reads up to n rows of [begin, end) in key order (or reverse).
func (s stmts) page(begin, end []byte, reverse bool, n int, out []kvbuf.Row) ([]kvbuf.Row, error) {
	st := s.fwd
	if reverse {
		st = s.rev
	}
	if err := st.bind([][]byte{begin, end}, int64(n)); err != nil {
		return out, err
	}
	defer st.reset()
	for {
		row, err := st.step()
		if err != nil || !row {
			return out, err
		}
		out = append(out, kvbuf.Row{K: st.blob(0), V: st.blob(1)})
	}
}

// readerConn is a pooled connection used for snapshot reads.
type readerConn struct {
	conn *cconn
	stmts
	pragmaDataVersion, getCommit *cstmt // the watch poller's
}

// readerCacheKiB bounds each reader connection's page cache.
const readerCacheKiB = 256

func (db *DB) getReader() (*readerConn, error) {
	select {
	case r := <-db.readers:
		return r, nil
	default:
	}
	c, err := openConn(db.path, db.opts.BusyTimeout)
	if err != nil {
		return nil, err
	}
	if err := c.execOnce("PRAGMA query_only = 1"); err != nil {
		c.close()
		return nil, err
	}
	// A reader's page cache is emptied whenever it starts a snapshot after
	// another commit, so a big one buys little; SQLite's default (2 MB)
	// on each of up to 64 pooled readers is C memory a node holds for
	// good once a wave of jobs has read through them.
	if err := c.execOnce(fmt.Sprintf("PRAGMA cache_size = -%d", readerCacheKiB)); err != nil {
		c.close()
		return nil, err
	}
	s, err := prepareReads(c)
	if err != nil {
		c.close()
		return nil, err
	}
	return &readerConn{conn: c, stmts: s}, nil
}

func (db *DB) putReader(r *readerConn) {
	if db.isClosed() {
		r.close()
		return
	}
	select {
	case db.readers <- r:
	default:
		r.close()
	}
}

func (r *readerConn) close() error { return r.conn.close() }

// dataVersion returns PRAGMA data_version (prepared on first use).
func (r *readerConn) dataVersion() (int64, error) {
	if r.pragmaDataVersion == nil {
		var err error
		if r.pragmaDataVersion, err = r.conn.prepare("PRAGMA data_version"); err != nil {
			return 0, err
		}
	}
	return r.pragmaDataVersion.int64Row()
}

// commitCounter reads the commit counter (prepared on first use).
func (r *readerConn) commitCounter() (int64, error) {
	if r.getCommit == nil {
		var err error
		if r.getCommit, err = r.conn.prepare(qGetCommit); err != nil {
			return 0, err
		}
	}
	return r.getCommit.int64Row()
}

// writerConn is the process's one write connection.
type writerConn struct {
	conn *cconn
	stmts
	set, del, delRange, getCommit, setCommit *cstmt
	beginImmediate, commit                   *cstmt
}

func (w *writerConn) prepare() error {
	var err error
	if w.stmts, err = prepareReads(w.conn); err != nil {
		return err
	}
	for _, p := range []struct {
		dst **cstmt
		q   string
	}{
		{&w.set, "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)"},
		{&w.del, "DELETE FROM kv WHERE k = ?"},
		{&w.delRange, "DELETE FROM kv WHERE k >= ? AND k < ?"},
		{&w.getCommit, qGetCommit},
		{&w.setCommit, "UPDATE meta SET value = ? WHERE name = 'commit'"},
		{&w.beginImmediate, "BEGIN IMMEDIATE"},
		{&w.commit, "COMMIT"},
	} {
		if *p.dst, err = w.conn.prepare(p.q); err != nil {
			return err
		}
	}
	return nil
}

// run binds blobs and ints to st and runs it.
func run(st *cstmt, blobs [][]byte, ints ...int64) error {
	if err := st.bind(blobs, ints...); err != nil {
		return err
	}
	return st.exec()
}

func (w *writerConn) close() error { return w.conn.close() }
