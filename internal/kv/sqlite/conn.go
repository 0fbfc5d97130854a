package sqlite

import (
	"context"
	"database/sql"
	"errors"
)

const (
	qGet      = "SELECT v FROM kv WHERE k = ?"
	qRangeFwd = "SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k LIMIT ?"
	qRangeRev = "SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k DESC LIMIT ?"
)

// stmts are the read statements every connection prepares.
type stmts struct {
	get, fwd, rev   *sql.Stmt
	begin, rollback *sql.Stmt // BEGIN (deferred) and ROLLBACK, prepared once
}

func prepareReads(ctx context.Context, c *sql.Conn) (stmts, error) {
	var s stmts
	var err error
	if s.get, err = c.PrepareContext(ctx, qGet); err != nil {
		return s, err
	}
	if s.fwd, err = c.PrepareContext(ctx, qRangeFwd); err != nil {
		return s, err
	}
	if s.rev, err = c.PrepareContext(ctx, qRangeRev); err != nil {
		return s, err
	}
	if s.begin, err = c.PrepareContext(ctx, "BEGIN"); err != nil {
		return s, err
	}
	s.rollback, err = c.PrepareContext(ctx, "ROLLBACK")
	return s, err
}

func (s stmts) close() {
	for _, st := range []*sql.Stmt{s.get, s.fwd, s.rev, s.begin, s.rollback} {
		if st != nil {
			st.Close()
		}
	}
}

// get reads one key: (nil, false) if absent; a present empty value is
// returned as a non-nil empty slice.
func (s stmts) getValue(key []byte) ([]byte, bool, error) {
	var v []byte
	err := s.get.QueryRow(nonNil(key)).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if v == nil {
		v = []byte{}
	}
	return v, true, nil
}

// page reads up to n rows of [begin, end) in key order (or reverse).
func (s stmts) page(begin, end []byte, reverse bool, n int, out []kvPair) ([]kvPair, error) {
	st := s.fwd
	if reverse {
		st = s.rev
	}
	rows, err := st.Query(nonNil(begin), nonNil(end), n)
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var p kvPair
		if err := rows.Scan(&p.k, &p.v); err != nil {
			return out, err
		}
		if p.k == nil {
			p.k = []byte{}
		}
		if p.v == nil {
			p.v = []byte{}
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

type kvPair struct{ k, v []byte }

// nonNil makes sure an empty key binds as an empty BLOB, not NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// readerConn is a pooled connection used for snapshot reads.
type readerConn struct {
	conn *sql.Conn
	stmts
}

func (db *DB) getReader(ctx context.Context) (*readerConn, error) {
	select {
	case r := <-db.readers:
		return r, nil
	default:
	}
	c, err := db.sql.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := c.ExecContext(ctx, "PRAGMA query_only = 1"); err != nil {
		c.Close()
		return nil, err
	}
	s, err := prepareReads(ctx, c)
	if err != nil {
		s.close()
		c.Close()
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

func (r *readerConn) close() error {
	r.stmts.close()
	return r.conn.Close()
}

// writerConn is the process's one write connection.
type writerConn struct {
	conn *sql.Conn
	stmts
	set, del, delRange, getCommit, setCommit *sql.Stmt
	beginImmediate, commit                   *sql.Stmt
}

func newWriterConn(ctx context.Context, c *sql.Conn) (*writerConn, error) {
	return &writerConn{conn: c}, nil
}

func (w *writerConn) prepare(ctx context.Context) error {
	var err error
	if w.stmts, err = prepareReads(ctx, w.conn); err != nil {
		return err
	}
	for _, p := range []struct {
		dst **sql.Stmt
		q   string
	}{
		{&w.set, "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)"},
		{&w.del, "DELETE FROM kv WHERE k = ?"},
		{&w.delRange, "DELETE FROM kv WHERE k >= ? AND k < ?"},
		{&w.getCommit, "SELECT value FROM meta WHERE name = 'commit'"},
		{&w.setCommit, "UPDATE meta SET value = ? WHERE name = 'commit'"},
		{&w.beginImmediate, "BEGIN IMMEDIATE"},
		{&w.commit, "COMMIT"},
	} {
		if *p.dst, err = w.conn.PrepareContext(ctx, p.q); err != nil {
			return err
		}
	}
	return nil
}

func (w *writerConn) exec(q string) error {
	_, err := w.conn.ExecContext(context.Background(), q)
	return err
}

func (w *writerConn) close() error {
	w.stmts.close()
	for _, st := range []*sql.Stmt{w.set, w.del, w.delRange, w.getCommit, w.setCommit, w.beginImmediate, w.commit} {
		if st != nil {
			st.Close()
		}
	}
	return w.conn.Close()
}
