// Package sqlite is couchrep's embedded job store: an implementation of
// kv.Database on one SQLite file (pure Go, modernc.org/sqlite, no cgo) in
// WAL mode, shared safely by several node processes on one machine.
//
// Layout: an ordered `kv(k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID` table and
// a `meta` table holding the format version and the commit counter; the file
// is marked with SQLite's application_id so that Open refuses files that are
// not couchrep stores without writing to them.
//
// Transactions are optimistic. A transaction's function reads through the
// writer connection, whose page cache stays warm, one statement at a time
// while no write transaction runs, moving on to a newer state only when the
// commits in between wrote nothing it read; otherwise it runs again on a
// read snapshot (a read transaction on a pooled reader connection), see
// read.go. It buffers its writes; its non-snapshot reads are recorded (point reads with
// their values, range reads with a digest of the rows consumed). Commit
// hands the transaction to the process's single writer: concurrent commits
// are grouped into one SQLite write transaction (group commit), and each
// logical transaction is first validated by re-reading its read set inside
// that write transaction, so a read invalidated by an earlier transaction in
// the batch, by an earlier batch or by another process makes it fail with
// kv.ErrConflict, and Transact runs it again. When every commit since the
// transaction's snapshot was this process's own, validation compares the
// read set with what those commits wrote, in memory, instead of re-reading
// (see validate.go). Because validation happens
// under SQLite's write lock, read-modify-write is serializable across
// processes.
//
// Between processes, a blocking flock on the sidecar file "<path>.lock" is
// held around every write transaction, so waiting writers are woken by the
// kernel in turn instead of polling SQLite's busy handler (which starves
// them). kill -9 releases the lock with the process; SQLite's WAL rolls back
// anything uncommitted.
//
// Checkpoints (copying the WAL back into the database) run on a goroutine
// of their own instead of inside a commit; see checkpoint.go.
//
// Versionstamps are the commit counter stored in the file (incremented in
// every write transaction, so strictly increasing across processes), 8 bytes
// big-endian, followed by the transaction's 2-byte position in its batch.
//
// Watches: an in-process commit notifies the watch goroutine of the keys it
// wrote; commits by other processes are found by polling PRAGMA data_version
// (one goroutine per DB, only while watches are pending) and comparing the
// commit counter with this process's own commits. A watch fires when the
// value at its key differs from the value it was armed with at commit.
package sqlite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/kv"
)

// ErrNotStore is returned (wrapped, with the path) by Open for a file that
// exists but is not a couchrep store.
var ErrNotStore = errors.New("sqlite: not a couchrep store")

// applicationID marks couchrep store files ("crkv").
const applicationID = 0x63726b76

// formatVersion is the schema version kept in the meta table.
const formatVersion = 1

// Options configure Open. The zero value is usable.
type Options struct {
	// Durability of commits; kv.DurabilityNormal (WAL, synchronous=NORMAL)
	// by default, kv.DurabilityFull is synchronous=FULL: every commit is
	// fsynced. The file is never corrupted either way.
	Durability kv.Durability
	// Logger receives the store's structured logs.
	Logger zerolog.Logger
	// MaxAttempts bounds how many times Transact runs a transaction that
	// keeps conflicting; 100 by default.
	MaxAttempts int
	// MaxBatch bounds how many logical transactions one group commit holds;
	// 64 by default.
	MaxBatch int
	// PollInterval is how often pending watches check for commits by other
	// processes (PRAGMA data_version) while there is activity; 5ms by
	// default.
	PollInterval time.Duration
	// MaxPollInterval bounds the poll's back-off: each poll that finds
	// data_version unchanged doubles the interval, up to this; a change
	// seen, a local commit or a newly armed watch brings it back to
	// PollInterval. 100ms by default: a node polls 10 times a second
	// instead of 200, and a cross-process change after a quiet spell is
	// still seen within a tenth of a second (jobs' own timers are seconds).
	MaxPollInterval time.Duration
	// QuietMaxPollInterval replaces MaxPollInterval once no other process
	// has committed for QuietAfter: a node alone on its store (couchrepd
	// holds its data directory; other nodes write heartbeats every few
	// seconds) polls once a second, and the first change another process
	// makes after such a spell is seen within a second, the next ones
	// within MaxPollInterval again. 1s and one minute by default.
	QuietMaxPollInterval time.Duration
	QuietAfter           time.Duration
	// BusyTimeout is SQLite's busy timeout for locks the lock file does not
	// cover (checkpoints, processes without the lock file); 30s by default.
	BusyTimeout time.Duration

	// ckptFrames overrides ckptTargetFrames (tests).
	ckptFrames int
}

func (o *Options) fill() {
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 100
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 64
	}
	if o.MaxBatch > 65535 {
		o.MaxBatch = 65535
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 5 * time.Millisecond
	}
	if o.MaxPollInterval < o.PollInterval {
		o.MaxPollInterval = max(100*time.Millisecond, o.PollInterval)
	}
	if o.QuietMaxPollInterval < o.MaxPollInterval {
		o.QuietMaxPollInterval = max(time.Second, o.MaxPollInterval)
	}
	if o.QuietAfter <= 0 {
		o.QuietAfter = time.Minute
	}
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 30 * time.Second
	}
	if o.ckptFrames <= 0 {
		o.ckptFrames = ckptTargetFrames
		if o.Durability == kv.DurabilityFull {
			o.ckptFrames = ckptTargetFramesFull
		}
	}
}

// DB is an open store. It implements kv.Database and is safe for concurrent
// use.
type DB struct {
	path  string
	opts  Options
	log   zerolog.Logger
	lock  *os.File // "<path>.lock", flocked around write transactions
	queue *os.File // "<path>.lock-queue", the turnstile in front of lock
	seed  maphash.Seed

	writer  *writerConn
	readers chan *readerConn // idle reader connections

	// wmu serializes the writer connection between the leading goroutine
	// (a whole write transaction) and transactions reading through it
	// (one statement at a time); see read.go. The fields below are the
	// writer connection's state as last observed, guarded by wmu.
	wmu sync.Mutex
	// wgen is bumped whenever the writer connection's view may have
	// changed (a write transaction of ours, or a commit by another
	// process noticed through wdv).
	wgen uint64
	// wver is the commit version the writer connection's view holds, or
	// -1 if unknown (another process committed since our last write).
	wver int64
	// wdv is the connection's data version (SQLITE_FCNTL_DATA_VERSION)
	// when wgen was last bumped; it changes when SQLite notices another
	// process's commit.
	wdv uint32
	// wclosed: the writer connection is closed (guarded by wmu).
	wclosed bool
	// moves counts transaction attempts whose reads through the writer
	// connection could not continue consistently (run again on a reader
	// snapshot).
	moves atomic.Int64
	// batches and batched count group commits and the requests in them.
	batches, batched atomic.Int64

	mu      sync.Mutex // guards the fields below
	idle    *sync.Cond // signalled when leading turns false
	pending []*commitReq
	leading bool // a goroutine is running batches
	closed  bool

	// own remembers what this process's recent commits wrote; only the
	// leading goroutine uses it.
	own ownCommits
	// committed is the newest commit version this process made, or saw
	// at open; see validateKnown.
	committed atomic.Int64
	// rereads counts transactions validated by re-reading their read set.
	rereads atomic.Int64
	// inflight counts Transact attempts running their function; see gather.
	inflight atomic.Int64

	// fileMu serializes this process's holders of the lock file (the
	// leader and the checkpoint goroutine): flock does not exclude two
	// users of one file descriptor.
	fileMu sync.Mutex
	// queuedHook, set by tests before the first commit, runs in every
	// group commit once this process is in line for the lock file (see
	// lockFile).
	queuedHook func()
	// ckptKick wakes the checkpoint goroutine; sinceCkpt counts group
	// commits since the last kick (leader only). See checkpoint.go.
	ckptKick  chan struct{}
	sinceCkpt int64
	// ckptBehind: the last kick found the previous one not yet taken
	// (leader only; see kickCheckpoint).
	ckptBehind bool
	ckptEvery  atomic.Int64 // group commits between kicks, set by the checkpoint goroutine
	// ckptDone is signalled after each checkpoint (for tests);
	// ckptComplete counts those completed under the write lock.
	ckptDone     chan struct{}
	ckptComplete atomic.Int64

	watches *watchSet
	closing chan struct{}
	done    sync.WaitGroup
}

var _ kv.Database = (*DB)(nil)

// Open opens (creating if needed) the store at path. It refuses, without
// writing to it, a file that is not a couchrep store.
func Open(ctx context.Context, path string, opts Options) (*DB, error) {
	opts.fill()
	// A relative path would be read as a URI authority ("file:data/x.db").
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	if err := checkHeader(path); err != nil {
		return nil, err
	}
	db := &DB{
		path:     path,
		opts:     opts,
		log:      opts.Logger.With().Str("component", "kv/sqlite").Str("path", path).Logger(),
		seed:     maphash.MakeSeed(),
		readers:  make(chan *readerConn, 64),
		closing:  make(chan struct{}),
		ckptKick: make(chan struct{}, 1),
		ckptDone: make(chan struct{}, 1),
	}
	db.idle = sync.NewCond(&db.mu)
	db.ckptEvery.Store(ckptEvery)
	if err := db.init(ctx); err != nil {
		db.closeResources()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	db.watches = newWatchSet(db)
	db.done.Add(2)
	go db.watchLoop()
	go db.checkpointLoop()
	db.log.Debug().Stringer("durability", opts.Durability).Msg("store opened")
	return db, nil
}

// checkHeader refuses a non-empty file that is not an SQLite database.
func checkHeader(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	if st.IsDir() {
		return fmt.Errorf("sqlite: open %s: is a directory", path)
	}
	hdr := make([]byte, 16)
	n, _ := f.Read(hdr)
	if n == 0 {
		return nil
	}
	if n < 16 || !bytes.Equal(hdr, []byte("SQLite format 3\x00")) {
		return fmt.Errorf("sqlite: open %s: %w (not an SQLite file)", path, ErrNotStore)
	}
	return nil
}

func (db *DB) init(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	conn, err := openConn(db.path, db.opts.BusyTimeout)
	if err != nil {
		return err
	}
	w := &writerConn{conn: conn}
	db.writer = w
	if err := checkStore(conn); err != nil {
		return err
	}
	// The lock file is held from the switch to WAL on. Switching a new
	// file to WAL upgrades a read transaction to a write one, which SQLite
	// refuses at once with SQLITE_BUSY ("database is locked"), busy
	// timeout or not, while another connection switches it too: two
	// processes opening a new store at once failed so, about 1 open in
	// 100 (TestOpenConcurrently).
	lock, err := os.OpenFile(db.path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("lock file: %w", err)
	}
	db.lock = lock
	if db.queue, err = os.OpenFile(db.path+".lock-queue", os.O_CREATE|os.O_RDWR, 0o644); err != nil {
		return fmt.Errorf("lock file: %w", err)
	}
	if err := db.lockFile(nil); err != nil {
		return err
	}
	defer db.unlockFile()
	if err := conn.execOnce("PRAGMA journal_mode=WAL"); err != nil {
		return fmt.Errorf("journal_mode=WAL: %w", err)
	}
	sync := "NORMAL"
	if db.opts.Durability == kv.DurabilityFull {
		sync = "FULL"
	}
	if err := conn.execOnce("PRAGMA synchronous=" + sync); err != nil {
		return err
	}
	// The checkpoint goroutine checkpoints instead (checkpoint.go).
	if err := conn.execOnce("PRAGMA wal_autocheckpoint=0"); err != nil {
		return err
	}
	if err := conn.execOnce("BEGIN IMMEDIATE"); err != nil {
		return err
	}
	if err := createSchema(conn); err != nil {
		_ = conn.execOnce("ROLLBACK")
		return err
	}
	if err := conn.execOnce("COMMIT"); err != nil {
		return err
	}
	if err := w.prepare(); err != nil {
		return err
	}
	version, err := w.getCommit.int64Row()
	if err != nil {
		return fmt.Errorf("read commit counter: %w", err)
	}
	db.committed.Store(version)
	db.wmu.Lock()
	db.wgen, db.wver, db.wdv = 1, version, w.conn.dataVersion()
	db.wmu.Unlock()
	return nil
}

// checkStore refuses an SQLite file that is not empty and not ours,
// reading its header and schema in one snapshot, without writing.
func checkStore(conn *cconn) error {
	if err := conn.execOnce("BEGIN"); err != nil {
		return err
	}
	defer conn.execOnce("ROLLBACK") //nolint:errcheck // read-only
	tables, err := conn.intOnce("SELECT count(*) FROM sqlite_schema")
	if err != nil {
		return err
	}
	appID, err := conn.intOnce("PRAGMA application_id")
	if err != nil {
		return err
	}
	if appID != applicationID && (appID != 0 || tables != 0) {
		return fmt.Errorf("%w (application_id %#x, %d schema entries)", ErrNotStore, appID, tables)
	}
	return nil
}

func createSchema(conn *cconn) error {
	n, err := conn.intOnce("SELECT count(*) FROM sqlite_schema WHERE name = 'kv'")
	if err != nil {
		return err
	}
	if n == 0 {
		for _, q := range []string{
			"CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID",
			"CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
			fmt.Sprintf("INSERT INTO meta VALUES ('format', %d), ('commit', 0)", formatVersion),
			fmt.Sprintf("PRAGMA application_id = %d", applicationID),
		} {
			if err := conn.execOnce(q); err != nil {
				return err
			}
		}
		return nil
	}
	format, err := conn.intOnce("SELECT value FROM meta WHERE name = 'format'")
	if err != nil {
		return fmt.Errorf("%w: reading format: %v", ErrNotStore, err)
	}
	if format != formatVersion {
		return fmt.Errorf("%w: format %d, this build reads %d", ErrNotStore, format, formatVersion)
	}
	return nil
}

// lockFile takes the inter-process write lock. It passes through a
// turnstile first: the queue lock is held while waiting for the main lock
// and released once it is taken. A process that just released the main
// lock must pass the turnstile again, which a waiting process holds, so the
// waiter gets the main lock first. flock alone wakes waiters without
// handing the lock over, and a busy process would take it again at once.
//
// So once a process is in line (holds the queue lock), at most one write
// transaction commits before it gets the main lock: the one holding it
// then, whichever the number of processes; TestFairness checks that bound.
// queued, if not nil, runs at that point.
func (db *DB) lockFile(queued func()) error {
	if err := flock(db.queue, syscall.LOCK_EX); err != nil {
		return fmt.Errorf("sqlite: lock %s: %w", db.queue.Name(), err)
	}
	if queued != nil {
		queued()
	}
	err := flock(db.lock, syscall.LOCK_EX)
	_ = flock(db.queue, syscall.LOCK_UN)
	if err != nil {
		return fmt.Errorf("sqlite: lock %s: %w", db.lock.Name(), err)
	}
	return nil
}

func (db *DB) unlockFile() { _ = flock(db.lock, syscall.LOCK_UN) }

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}

// Path returns the file the store was opened on.
func (db *DB) Path() string { return db.path }

// Close waits for in-flight commits, fails pending watches with
// kv.ErrClosed and releases the file. It is safe to call twice.
func (db *DB) Close() error {
	db.mu.Lock()
	if db.closed {
		db.mu.Unlock()
		return nil
	}
	db.closed = true
	for db.leading {
		db.idle.Wait() // let the running batch finish; new commits are refused
	}
	pending := db.pending
	db.pending = nil
	db.mu.Unlock()
	for _, r := range pending {
		r.finish(kv.ErrClosed)
	}
	close(db.closing)
	db.done.Wait()
	return db.closeResources()
}

func (db *DB) closeResources() error {
	var errs []error
	for {
		select {
		case r := <-db.readers:
			errs = append(errs, r.close())
			continue
		default:
		}
		break
	}
	if db.writer != nil {
		db.wmu.Lock()
		db.wclosed = true
		errs = append(errs, db.writer.close())
		db.wmu.Unlock()
	}
	for _, f := range []*os.File{db.lock, db.queue} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sqlite: close %s: %w", db.path, err)
	}
	return nil
}

func (db *DB) isClosed() bool {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.closed
}
