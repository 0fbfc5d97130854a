package sqlite

import (
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"modernc.org/libc"
	_ "modernc.org/sqlite" // its init applies the library's runtime patches
	sqlite3 "modernc.org/sqlite/lib"
)

// The store talks to SQLite through its C API (modernc.org/sqlite/lib, the
// library translated to Go) rather than through database/sql and the
// modernc driver. Each connection belongs to one goroutine at a time (a
// reader to its transaction, the writer to the leading goroutine), so it
// is opened with SQLITE_OPEN_NOMUTEX: the driver's connections are
// FULLMUTEX, and the mutexes, database/sql's per-call bookkeeping and the
// driver's C allocation of every bound blob cost about a fifth of a
// job-queue cycle's CPU (see BENCHMARKS.md, "KV store").

// cconn is one SQLite connection. It is not safe for concurrent use.
type cconn struct {
	tls   *libc.TLS
	db    uintptr
	arena uintptr // C memory holding the bound blobs of the running statement
	size  int     // arena's size
	stmts []*cstmt
}

// cstmt is a prepared statement of a cconn.
type cstmt struct {
	c *cconn
	p uintptr
}

// peekPtr reads the pointer stored at C address p.
func peekPtr(p uintptr) uintptr {
	return *(*uintptr)(unsafe.Pointer(&libc.GoBytes(p, int(unsafe.Sizeof(uintptr(0))))[0]))
}

// openConn opens a connection to the file at path (created if missing).
func openConn(path string, busy time.Duration) (*cconn, error) {
	c := &cconn{tls: libc.NewTLS()}
	zPath, err := libc.CString(path)
	if err != nil {
		c.tls.Close()
		return nil, err
	}
	defer libc.Xfree(c.tls, zPath)
	pdb := c.tls.Alloc(int(unsafe.Sizeof(uintptr(0))))
	rc := sqlite3.Xsqlite3_open_v2(c.tls, zPath, pdb,
		sqlite3.SQLITE_OPEN_READWRITE|sqlite3.SQLITE_OPEN_CREATE|sqlite3.SQLITE_OPEN_NOMUTEX, 0)
	c.db = peekPtr(pdb)
	c.tls.Free(int(unsafe.Sizeof(uintptr(0))))
	if rc != sqlite3.SQLITE_OK {
		err := c.errorf(rc, "open")
		c.close()
		return nil, err
	}
	sqlite3.Xsqlite3_extended_result_codes(c.tls, c.db, 1)
	if rc := sqlite3.Xsqlite3_busy_timeout(c.tls, c.db, int32(busy.Milliseconds())); rc != sqlite3.SQLITE_OK {
		err := c.errorf(rc, "busy timeout")
		c.close()
		return nil, err
	}
	return c, nil
}

// errorf describes result code rc of what.
func (c *cconn) errorf(rc int32, what string) error {
	msg := libc.GoString(sqlite3.Xsqlite3_errstr(c.tls, rc))
	if c.db != 0 {
		if m := libc.GoString(sqlite3.Xsqlite3_errmsg(c.tls, c.db)); m != "" && m != msg {
			msg += ": " + m
		}
	}
	return fmt.Errorf("%s: %s (%d)", what, msg, rc)
}

// dataVersion returns the main database's data version: it changes when
// the connection, starting a transaction, finds that another connection
// committed (SQLITE_FCNTL_DATA_VERSION; the connection's own commits do not
// change it).
func (c *cconn) dataVersion() uint32 {
	z := c.tls.Alloc(8) // "main\x00" and then the result
	defer c.tls.Free(8)
	copy(libc.GoBytes(z, 5), "main\x00")
	p := c.tls.Alloc(4)
	defer c.tls.Free(4)
	if rc := sqlite3.Xsqlite3_file_control(c.tls, c.db, z, sqlite3.SQLITE_FCNTL_DATA_VERSION, p); rc != sqlite3.SQLITE_OK {
		return 0
	}
	return binary.NativeEndian.Uint32(libc.GoBytes(p, 4))
}

// prepare compiles one SQL statement, finalized when c closes.
func (c *cconn) prepare(q string) (*cstmt, error) {
	z, err := libc.CString(q)
	if err != nil {
		return nil, err
	}
	defer libc.Xfree(c.tls, z)
	pp := c.tls.Alloc(int(unsafe.Sizeof(uintptr(0))))
	rc := sqlite3.Xsqlite3_prepare_v2(c.tls, c.db, z, -1, pp, 0)
	p := peekPtr(pp)
	c.tls.Free(int(unsafe.Sizeof(uintptr(0))))
	if rc != sqlite3.SQLITE_OK {
		return nil, c.errorf(rc, "prepare "+q)
	}
	if p == 0 {
		return nil, fmt.Errorf("prepare %q: no statement", q)
	}
	s := &cstmt{c: c, p: p}
	c.stmts = append(c.stmts, s)
	return s, nil
}

// execOnce prepares, runs (discarding rows) and finalizes q.
func (c *cconn) execOnce(q string) error {
	s, err := c.prepare(q)
	if err != nil {
		return err
	}
	defer c.finalize(s)
	return s.exec()
}

// intOnce prepares q, returns the integer in the first column of its first
// row, and finalizes it.
func (c *cconn) intOnce(q string) (int64, error) {
	s, err := c.prepare(q)
	if err != nil {
		return 0, err
	}
	defer c.finalize(s)
	return s.int64Row()
}

func (c *cconn) finalize(s *cstmt) {
	for i, x := range c.stmts {
		if x == s {
			c.stmts = append(c.stmts[:i], c.stmts[i+1:]...)
			break
		}
	}
	sqlite3.Xsqlite3_finalize(c.tls, s.p)
	s.p = 0
}

// close finalizes the statements and closes the connection.
func (c *cconn) close() error {
	if c.tls == nil {
		return nil
	}
	for _, s := range c.stmts {
		sqlite3.Xsqlite3_finalize(c.tls, s.p)
	}
	c.stmts = nil
	var err error
	if c.db != 0 {
		if rc := sqlite3.Xsqlite3_close_v2(c.tls, c.db); rc != sqlite3.SQLITE_OK {
			err = c.errorf(rc, "close")
		}
		c.db = 0
	}
	if c.arena != 0 {
		libc.Xfree(c.tls, c.arena)
		c.arena = 0
	}
	c.tls.Close()
	c.tls = nil
	return err
}

// bind binds blobs to parameters 1..len(blobs) (then ints to the following
// ones). Blobs are copied into the connection's arena and bound without a
// copy by SQLite (SQLITE_STATIC): the statement is run and reset before
// the connection binds anything else, and every run binds all its
// parameters anew.
func (s *cstmt) bind(blobs [][]byte, ints ...int64) error {
	c := s.c
	total := 0
	for _, b := range blobs {
		total += len(b)
	}
	if total > c.size {
		n := max(total, 2*c.size, 4096)
		p := libc.Xrealloc(c.tls, c.arena, libc.Tsize_t(n))
		if p == 0 {
			return fmt.Errorf("bind: cannot allocate %d bytes", n)
		}
		c.arena, c.size = p, n
	}
	off := 0
	for i, b := range blobs {
		var rc int32
		if len(b) == 0 {
			rc = sqlite3.Xsqlite3_bind_zeroblob(c.tls, s.p, int32(i+1), 0)
		} else {
			copy(libc.GoBytes(c.arena+uintptr(off), len(b)), b)
			rc = sqlite3.Xsqlite3_bind_blob(c.tls, s.p, int32(i+1), c.arena+uintptr(off), int32(len(b)), 0)
			off += len(b)
		}
		if rc != sqlite3.SQLITE_OK {
			return c.errorf(rc, "bind")
		}
	}
	for i, v := range ints {
		if rc := sqlite3.Xsqlite3_bind_int64(c.tls, s.p, int32(len(blobs)+i+1), v); rc != sqlite3.SQLITE_OK {
			return c.errorf(rc, "bind")
		}
	}
	return nil
}

// step advances s: true with a row, false when done.
func (s *cstmt) step() (bool, error) {
	switch rc := sqlite3.Xsqlite3_step(s.c.tls, s.p); rc {
	case sqlite3.SQLITE_ROW:
		return true, nil
	case sqlite3.SQLITE_DONE:
		return false, nil
	default:
		return false, s.c.errorf(rc, "step")
	}
}

func (s *cstmt) reset() { sqlite3.Xsqlite3_reset(s.c.tls, s.p) }

// exec runs s to completion (rows are discarded) and resets it.
func (s *cstmt) exec() error {
	defer s.reset()
	for {
		row, err := s.step()
		if err != nil || !row {
			return err
		}
	}
}

// int64Row runs s and returns the first column of its first row as an
// integer (0 without rows).
func (s *cstmt) int64Row() (int64, error) {
	defer s.reset()
	row, err := s.step()
	if err != nil || !row {
		return 0, err
	}
	return sqlite3.Xsqlite3_column_int64(s.c.tls, s.p, 0), nil
}

// int64Col returns column i of the current row as an integer.
func (s *cstmt) int64Col(i int32) int64 { return sqlite3.Xsqlite3_column_int64(s.c.tls, s.p, i) }

// blob returns a copy of column i of the current row (never nil).
func (s *cstmt) blob(i int32) []byte {
	p := sqlite3.Xsqlite3_column_blob(s.c.tls, s.p, i)
	n := sqlite3.Xsqlite3_column_bytes(s.c.tls, s.p, i)
	v := make([]byte, n)
	if n > 0 && p != 0 {
		copy(v, libc.GoBytes(p, int(n)))
	}
	return v
}
