// Package postgres is a kv.Database on PostgreSQL (through pgx and its
// pool): the job store for couchrep nodes on several machines.
//
// The FDB model on PostgreSQL (README.md beside this file has the details
// and how each guarantee maps to FoundationDB's):
//
//   - Keys and values live in one table, couchrep_kv (k bytea PRIMARY KEY,
//     v bytea, ver bigint), so range reads are index range scans in key
//     order, forward or reverse, with limits.
//   - A transaction's reads run in a REPEATABLE READ, READ ONLY
//     transaction: one consistent snapshot, whose commit version (snap) is
//     read with it. Writes are buffered in the client (reads see them).
//   - The commit is one round trip, one implicit transaction (the
//     pipeline's statements up to its Sync): couchrep_kv_lock (the next
//     commit version, from a one-row table whose row lock orders commits
//     across all nodes), one couchrep_kv_apply per transaction of the
//     batch (the transactions of this DB committing at the same time go
//     together; each fails, writing nothing, when a commit after its
//     snapshot wrote a key in its read set, as the rows' ver and a log of
//     recent clears say). The writes' keys are sent on NOTIFY. The
//     outcome is FDB's: strictly serializable, in commit order, with
//     conflicts only on what was read without Snapshot, and atomic Add
//     free of conflicts.
//   - Transact retries 40001 (conflicts) and 40P01 (deadlocks) with a
//     bounded backoff; ReadTransact runs its function once.
//   - Watches: one LISTEN connection per Database; a notification makes
//     the watches on the keys it names compare their key's value again.
//
// The schema is created on first use and versioned in couchrep_schema; a
// database with a newer schema is refused (ErrSchemaTooNew).
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvbuf"
	"github.com/couchrep/couchrep/internal/redact"
)

// Options tune Open.
type Options struct {
	// Durability of commits: kv.DurabilityNormal (the default) commits
	// with synchronous_commit = off, acknowledged before PostgreSQL flushed
	// them: a crash of a node loses nothing committed, a crash of the
	// database server may lose the last fraction of a second of commits,
	// never half a transaction. kv.DurabilityFull acknowledges once flushed
	// (synchronous_commit as the server is configured, on by default).
	Durability kv.Durability
	// MaxConns bounds the connection pool (default 16, or the DSN's
	// pool_max_conns). A transaction holds one connection from its first
	// read to its commit; when all are taken, transactions queue for one.
	MaxConns int32
	// LaneConns bounds the liveness lane (default 2): a pool of its own
	// for the transactions marked kv.WithPriority (heartbeats, lease
	// renewals) and the health check, so that job transactions queued for
	// the main pool never delay them. Their commits go ahead of the queued
	// ones on the commit connection, and that connection and the read
	// connection are opened from the lane too.
	LaneConns int32
	// MaxAttempts bounds how many times Transact runs a transaction that
	// keeps conflicting (default 100).
	MaxAttempts int
	// Logger receives the backend's few log lines (reconnects).
	Logger zerolog.Logger
}

// DB is an open PostgreSQL store. It implements kv.Database and
// kv.Checker.
type DB struct {
	pool   *pgxpool.Pool
	lane   *pgxpool.Pool // the liveness lane (Options.LaneConns)
	opts   Options
	log    zerolog.Logger
	secret string // the DSN's password, kept out of every error
	where  string // the DSN without its password, for errors

	watches *watchHub
	rt      atomic.Int64 // round trips of transactions (RoundTrips)
	cache   *commitCache // values of this DB's commits (cache.go)

	// Group commit (commit.go) on the commit connection (pipe.go), and the
	// first reads on the read connection (reads.go).
	commitQ  batcher[*commitReq]
	commits  pipeSlot
	readQ    batcher[*pointRead]
	reads    pipeSlot
	pruneDue atomic.Bool     // the clears log is due a pruning (pruneSQL)
	parked   chan parkedConn // connections whose snapshot awaits its ROLLBACK
	pmu      sync.Mutex      // parking vs Close

	closeOnce sync.Once
	closed    chan struct{}
	bg        sync.WaitGroup
}

var (
	_ kv.Database = (*DB)(nil)
	_ kv.Checker  = (*DB)(nil)
)

// IsDSN reports whether location names a PostgreSQL store
// (postgres:// or postgresql:// URL).
func IsDSN(location string) bool {
	return strings.HasPrefix(location, "postgres://") || strings.HasPrefix(location, "postgresql://")
}

// Open connects to the PostgreSQL database named by dsn (a postgres://
// URL or a key=value connection string, as libpq takes them), creates or
// upgrades the store's schema, and starts the watch listener.
func Open(ctx context.Context, dsn string, opts Options) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors may quote the string: say only what it is.
		return nil, fmt.Errorf("postgres: invalid connection string %q", redact.Text(dsn))
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 100
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	} else if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = 16
	}
	cfg.MaxConnIdleTime = time.Minute
	cfg.HealthCheckPeriod = 5 * time.Second
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	rp := cfg.ConnConfig.RuntimeParams
	if rp["application_name"] == "" {
		rp["application_name"] = "couchrep"
	}
	// Every statement of this package has an index to use; a generic
	// plan made while a table was small would scan it whole for good
	// (the commit's validation of the clears log did: schema 3).
	rp["enable_seqscan"] = "off"
	// pgx prepares every statement once per connection; under the default
	// plan_cache_mode (auto) PostgreSQL still plans the commit's apply
	// statement and the reads anew at every execution (their generic plans
	// look dearer than the custom ones to its estimate), which was more
	// than half of the server's CPU per job cycle. Their generic plans are
	// the index plans (checked with EXPLAIN; enable_seqscan = off keeps
	// them so as tables grow), so they are planned once per connection.
	rp["plan_cache_mode"] = "force_generic_plan"
	if opts.Durability == kv.DurabilityNormal {
		rp["synchronous_commit"] = "off"
	}
	db := &DB{
		opts:   opts,
		log:    opts.Logger.With().Str("component", "kv/postgres").Logger(),
		secret: cfg.ConnConfig.Password,
		where:  fmt.Sprintf("%s@%s:%d/%s", cfg.ConnConfig.User, cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database),
		closed: make(chan struct{}),
		parked: make(chan parkedConn, cfg.MaxConns),
		cache:  newCommitCache(),
	}
	db.commits.name, db.commits.listen = "commit connection", true
	db.commits.sql = []string{lockSQL, pruneSQL, fastApplySQL, applySQL}
	db.reads.name, db.reads.sql = "read connection", []string{autoGetSQL}
	if opts.LaneConns <= 0 {
		opts.LaneConns = 2
	}
	db.opts.LaneConns = opts.LaneConns
	lcfg := cfg.Copy()
	lcfg.MaxConns, lcfg.MinConns = opts.LaneConns, 0
	db.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, db.errorf("connect", err)
	}
	if db.lane, err = pgxpool.NewWithConfig(ctx, lcfg); err != nil {
		db.pool.Close()
		return nil, db.errorf("connect", err)
	}
	if err := migrate(ctx, db.pool); err != nil {
		db.pool.Close()
		db.lane.Close()
		return nil, db.errorf("schema", err)
	}
	db.watches = newWatchHub(db)
	db.bg.Add(3)
	go db.watches.listen()
	go db.watches.dispatch()
	go db.sweep()
	return db, nil
}

// redactedError keeps the wrapped error for errors.Is/As but never prints
// the password.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// errorf wraps err as "postgres: <what> (<user@host:port/db>): err",
// with the password (if the server or pgx ever quoted it) removed.
func (db *DB) errorf(what string, err error) error {
	if err == nil {
		return nil
	}
	e := fmt.Errorf("postgres: %s (%s): %w", what, db.where, err)
	if connLost(err) && !errors.Is(err, kv.ErrUnavailable) {
		e = fmt.Errorf("postgres: %s (%s): %w: %w", what, db.where, kv.ErrUnavailable, err)
	}
	if db.secret != "" && strings.Contains(e.Error(), db.secret) {
		return &redactedError{msg: strings.ReplaceAll(e.Error(), db.secret, redact.Mask), err: e}
	}
	return e
}

// connLost reports whether err says the connection or the server went
// away (or could not be reached): the store is unavailable for now.
func connLost(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return pgconn.SafeToRetry(err) || errors.As(err, &ce) || errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE)
}

// retryable reports whether err is a conflict worth running the
// transaction again for: a serialization failure (our validation, 40001)
// or a deadlock (40P01).
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "40001" || pe.Code == "40P01"
	}
	return false
}

func (db *DB) isClosed() bool {
	select {
	case <-db.closed:
		return true
	default:
		return false
	}
}

// Transact implements kv.Database.
func (db *DB) Transact(ctx context.Context, fn func(kv.Tx) error) error {
	return kvbuf.Retry(ctx, "postgres", db.opts.MaxAttempts, db.isClosed, func(attempt int) (kvbuf.Outcome, error) {
		t := newTx(ctx, db, false)
		err := t.Result(fn(t))
		if err == nil {
			err = ctx.Err() // never commit what a cancelled caller asked
		} else if verr := t.validateCached(); verr != nil && !t.conflict {
			// An error result must not rest on an unvalidated cached
			// read either; a failed check (not a conflict) is the error.
			err = verr
		}
		if err != nil {
			t.finish(err)
			if t.conflict {
				// A value read from the commit cache had changed: the
				// function saw an outdated state; run it again.
				return kvbuf.Again, err
			}
			if connLost(err) && attempt+1 < db.opts.MaxAttempts && ctx.Err() == nil && !db.isClosed() {
				// A read found the connection gone: nothing was written,
				// the function may run again (on a new connection).
				if err := kv.RetryBackoff(ctx, attempt+1); err != nil {
					return kvbuf.Stop, err
				}
				return kvbuf.AgainNow, err
			}
			return kvbuf.Stop, err
		}
		err = t.commit()
		if err == nil {
			return kvbuf.Stop, nil
		}
		t.finish(err)
		if !errors.Is(err, kv.ErrConflict) && !(errors.Is(err, errNotSent) && connLost(err)) {
			return kvbuf.Stop, err
		}
		return kvbuf.Again, err
	})
}

// ReadTransact implements kv.Database: fn runs once on one REPEATABLE
// READ, READ ONLY snapshot.
func (db *DB) ReadTransact(ctx context.Context, fn func(kv.ReadTx) error) error {
	if err := kvbuf.Usable(ctx, db.isClosed()); err != nil {
		return err
	}
	t := newTx(ctx, db, true)
	err := t.Result(fn(t))
	t.finish(err)
	return err
}

// Check implements kv.Checker: a round trip to the server through the
// liveness lane (a main pool busy with job transactions is no failure of
// the store), bounded by 5 s.
func (db *DB) Check(ctx context.Context) error {
	if db.isClosed() {
		return kv.ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := db.lane.Exec(ctx, "SELECT 1"); err != nil {
		return db.errorf("health check", err)
	}
	return nil
}

// RoundTrips returns how many round trips to the server the transactions
// of this DB made so far (begin, reads, commits, ends; not watches or
// health checks): what a transaction costs is mostly these.
func (db *DB) RoundTrips() int64 { return db.rt.Load() }

// Close implements kv.Database. Pending watches fail with kv.ErrClosed.
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		close(db.closed)
		db.watches.close()
		db.bg.Wait()
		db.commits.close()
		db.reads.close()
		db.unpark()
		db.pool.Close()
		db.lane.Close()
	})
	return nil
}

// beginSQL starts a transaction's snapshot; snapSQL reads its commit
// version in the same round trip.
const (
	beginSQL = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"
	snapSQL  = "SELECT cur FROM couchrep_kv_meta WHERE id = 1"
	getSQL   = "SELECT k, v FROM couchrep_kv WHERE k = $1"
	// manySQL reads many keys in one statement (tx.GetMany).
	manySQL = "SELECT k, v FROM couchrep_kv WHERE k = ANY ($1)"
	fwdSQL  = "SELECT k, v FROM couchrep_kv WHERE k >= $1 AND k < $2 ORDER BY k LIMIT $3"
	revSQL  = "SELECT k, v FROM couchrep_kv WHERE k >= $1 AND k < $2 ORDER BY k DESC LIMIT $3"
	// The first read of a transaction: the read and the snapshot's commit
	// version in one statement (one row without a key when nothing is
	// found).
	firstGetSQL = "SELECT m.cur, q.k, q.v FROM couchrep_kv_meta m LEFT JOIN (" + getSQL + ") q ON true WHERE m.id = 1"
	firstFwdSQL = "SELECT m.cur, q.k, q.v FROM couchrep_kv_meta m LEFT JOIN (" + fwdSQL + ") q ON true WHERE m.id = 1 ORDER BY q.k"
	firstRevSQL = "SELECT m.cur, q.k, q.v FROM couchrep_kv_meta m LEFT JOIN (" + revSQL + ") q ON true WHERE m.id = 1 ORDER BY q.k DESC"
	// autoGetSQL is a point read run on its own (tx.autoRead): the
	// statement's commit version, and the row with its version.
	autoGetSQL = "SELECT m.cur, q.k, q.v, q.ver FROM couchrep_kv_meta m LEFT JOIN (SELECT k, v, ver FROM couchrep_kv WHERE k = $1) q ON true WHERE m.id = 1"
	// autoCheckSQL is 1 if the row of key $1 has version $2 (-1: there
	// is none), else 0.
	autoCheckSQL = "SELECT CASE WHEN coalesce((SELECT ver FROM couchrep_kv WHERE k = $1), -1) = $2::bigint THEN 1::int8 ELSE 0::int8 END"
	// cacheCheckSQL counts the keys read from the commit cache that still
	// have the version they were read at (cache.go).
	cacheCheckSQL = "SELECT count(*) FROM couchrep_kv WHERE k = ANY ($1) AND ver = $2"
	// applySQL validates and applies one transaction of a commit batch
	// (schema.go, commit.go).
	applySQL = "SELECT o_ok, o_xv FROM couchrep_kv_apply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)"
)

// firstSQL maps each read to its first-read form.
var firstSQL = map[string]string{getSQL: firstGetSQL, fwdSQL: firstFwdSQL, revSQL: firstRevSQL}

// errNotSent marks a commit that failed before its statement reached the
// server (pgconn.SafeToRetry): running the transaction again is safe.
var errNotSent = errors.New("postgres: commit not sent")
