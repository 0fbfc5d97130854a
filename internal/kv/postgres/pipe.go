package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/couchrep/couchrep/internal/kv"
)

// The commit connection.
//
// Every commit batch of a DB goes to the server on one connection of its
// own, taken out of the pool, written to and read from at the same time:
// a batch is written (its Binds, Executes and Sync, one write) while the
// batch before it may still be running, and one reader goroutine takes
// the results as they come, in the order the batches were written (the
// server runs a connection's messages in order, each batch up to its Sync
// as one implicit transaction). pgx's connection (and its pipeline mode)
// is used by one goroutine at a time, which would make a batch wait for
// the previous one's result before it could be sent, so after preparing
// the commit's statements the connection is taken from pgx (Hijack) and
// spoken to with pgproto3 directly: writers (under their pipeSlot's mu)
// only send, the reader only receives. It also LISTENs for the watches
// (watch.go): the reader hands the notifications to the watch hub, which
// keeps the connection open while the DB is.
//
// Outcomes: a batch whose ReadyForQuery arrived has the results read (or
// the error of its first failed statement, after which the server skipped
// the rest). A batch whose write failed was not committed (its Sync, the
// last of its bytes, did not reach the server): errNotSent. A batch
// written whose result did not arrive before the connection broke has an
// unknown outcome, as with any connection: the error says so and is not
// retried. The next batch opens a new connection.

// pipe is one pipelined connection: the commit connection, or the read
// connection (reads.go), which works the same way.
type pipe struct {
	db    *DB
	conn  net.Conn
	pid   uint32 // the server process's
	fe    *pgproto3.Frontend
	stmts map[string]*pgconn.StatementDescription
	buf   []byte // the parameters of the batch being written (under the slot's mu)

	mu     sync.Mutex
	sent   []*sentBatch // written, result not read yet, in write order
	err    error        // why the connection is gone (set once)
	exited chan struct{}
}

// sentBatch is a batch on its way: its statements, what the reader has
// taken of their results, and where its outcome goes.
type sentBatch struct {
	calls   []call
	version int64
	next    int   // the statement whose results come next
	err     error // the first error of a statement (the rest were skipped)
	unsent  bool  // its write failed
	// deliver hands the outcome on: the commit version (commit batches),
	// or why the batch failed.
	deliver func(version int64, err error)
}

// pipeSlot is one of a DB's pipelined connections (the commit connection
// or the read connection): the connection while it works, opened again
// after it broke.
type pipeSlot struct {
	name   string   // for errors
	sql    []string // prepared when opened
	listen bool     // LISTENs for the watches

	mu sync.Mutex // writes, and p
	p  *pipe
}

// send writes batch on the commit connection (opening one if needed);
// its outcome reaches its callers through delivered.
func (db *DB) send(batch []*commitReq) {
	b := &sentBatch{deliver: func(version int64, err error) { db.delivered(batch, version, err) }}
	b.calls = db.batchCalls(batch, &b.version)
	if err := db.commits.write(db, b); err != nil {
		b.deliver(0, err)
	}
}

// write writes b, or returns why it could not (then nothing of it was
// sent).
func (s *pipeSlot) write(db *DB, b *sentBatch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.openedLocked(db)
	if err != nil {
		return err
	}
	return p.write(b)
}

// opened returns the connection, opening one if there is none or it
// broke.
func (s *pipeSlot) opened(db *DB) (*pipe, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.openedLocked(db)
}

func (s *pipeSlot) openedLocked(db *DB) (*pipe, error) {
	if s.p != nil && !s.p.broken() {
		return s.p, nil
	}
	if db.isClosed() {
		return nil, kv.ErrClosed
	}
	p, err := s.open(db)
	if err != nil {
		return nil, err
	}
	s.p = p
	return p, nil
}

// open takes a connection from the liveness lane for good (a main pool
// busy with job transactions must not keep the heartbeats' commits from
// their connection; a hijacked connection leaves the lane's count),
// prepares the slot's statements on it (and LISTENs) and starts its
// reader.
func (s *pipeSlot) open(db *DB) (*pipe, error) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	pc, err := db.lane.Acquire(ctx)
	if err != nil {
		if db.isClosed() {
			return nil, kv.ErrClosed
		}
		return nil, notSent{db.errorf("open the "+s.name, err)}
	}
	c := pc.Hijack() // no longer the pool's
	stmts := make(map[string]*pgconn.StatementDescription, len(s.sql))
	for _, sql := range s.sql {
		sd, err := prepare(ctx, c, sql)
		if err != nil {
			_ = c.Close(ctx)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) {
				err = notSent{err} // the connection failed: nothing was sent
			}
			return nil, err
		}
		stmts[sql] = sd
	}
	if s.listen {
		if _, err := c.Exec(ctx, "LISTEN "+channel); err != nil {
			_ = c.Close(ctx)
			return nil, notSent{err}
		}
	}
	hc, err := c.PgConn().Hijack()
	if err != nil {
		_ = c.Close(ctx)
		return nil, notSent{err}
	}
	p := &pipe{db: db, conn: hc.Conn, pid: hc.PID, fe: pgproto3.NewFrontend(hc.Conn, hc.Conn), stmts: stmts, exited: make(chan struct{})}
	go p.read()
	return p, nil
}

// current is the slot's connection (nil if none was opened yet).
func (s *pipeSlot) current() *pipe {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p
}

// close ends the slot's connection: batches in flight are delivered with
// the error.
func (s *pipeSlot) close() {
	if p := s.current(); p != nil {
		p.fail(kv.ErrClosed)
		<-p.exited
	}
}

// write encodes and writes b (the caller holds its slot's mu). An error
// means nothing of b was sent; once b is queued for the reader, its outcome is
// the reader's to deliver.
func (p *pipe) write(b *sentBatch) error {
	params := make([][][]byte, len(b.calls))
	p.buf = p.buf[:0]
	for i, cl := range b.calls {
		sd, ok := p.stmts[cl.sql]
		if !ok {
			sd = p.stmts[fastApplySQL] // a variant of it, not prepared yet: the same parameters
		}
		oids := sd.ParamOIDs
		var err error
		if cl.apply != nil {
			p.buf, params[i], err = cl.apply.encode(cl.order, oids, p.buf)
		} else {
			p.buf, params[i], err = encodeParams(oids, cl.args, p.buf)
		}
		if err != nil {
			return err
		}
	}
	for i, cl := range b.calls {
		sd, ok := p.stmts[cl.sql]
		if !ok {
			// A variant of the apply statement this connection has not
			// prepared yet: prepared in this write, ahead of its use.
			sd = &pgconn.StatementDescription{Name: "couchrep_apply_" + strconv.Itoa(len(p.stmts)), SQL: cl.sql,
				ParamOIDs: p.stmts[fastApplySQL].ParamOIDs}
			p.fe.SendParse(&pgproto3.Parse{Name: sd.Name, Query: sd.SQL, ParameterOIDs: sd.ParamOIDs})
			p.stmts[cl.sql] = sd
		}
		p.fe.SendBind(&pgproto3.Bind{PreparedStatement: sd.Name, ParameterFormatCodes: binaryFormat,
			Parameters: params[i], ResultFormatCodes: binaryFormat})
		p.fe.SendExecute(&pgproto3.Execute{})
	}
	p.fe.SendSync(&pgproto3.Sync{})
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return notSent{p.err}
	}
	p.sent = append(p.sent, b)
	if len(p.sent) == 1 {
		_ = p.conn.SetReadDeadline(time.Now().Add(batchTimeout))
	}
	p.mu.Unlock()
	p.db.rt.Add(1)
	if err := p.fe.Flush(); err != nil {
		p.mu.Lock()
		b.unsent = true
		p.mu.Unlock()
		p.fail(err)
	}
	return nil
}

// cause is why the connection is gone (nil while it is not).
func (p *pipe) cause() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// broken reports whether the connection is gone.
func (p *pipe) broken() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err != nil
}

// fail marks the connection gone and closes it; the reader then
// delivers the batches in flight.
func (p *pipe) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
		_ = p.conn.Close()
	}
}

// read takes the results of the batches in flight, in write order, and
// delivers each batch at its ReadyForQuery; when the connection breaks it
// delivers the rest with the error and exits.
func (p *pipe) read() {
	defer close(p.exited)
	for {
		msg, err := p.fe.Receive()
		if err != nil {
			p.fail(err)
			p.deliverAll()
			return
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			if b := p.head(); b != nil && b.err == nil && b.next < len(b.calls) && b.calls[b.next].row != nil {
				b.err = b.calls[b.next].row(m.Values)
			}
		case *pgproto3.CommandComplete:
			if b := p.head(); b != nil {
				b.next++
			}
		case *pgproto3.ErrorResponse:
			pe := pgconn.ErrorResponseToPgError(m)
			b := p.head()
			if b == nil || pe.Severity == "FATAL" || pe.Severity == "PANIC" || pe.Code == "0A000" || pe.Code == "26000" {
				// The server ends the connection, or a prepared statement
				// is gone or changed (a schema change): a new connection
				// prepares them again.
				p.fail(pe)
				p.deliverAll()
				return
			}
			if b.err == nil {
				b.err = pe
			}
		case *pgproto3.NotificationResponse:
			p.db.watches.notified(m.Payload)
		case *pgproto3.ReadyForQuery:
			b := p.pop()
			if b == nil {
				p.fail(errors.New("postgres: commit connection: a result without a batch"))
				p.deliverAll()
				return
			}
			err := b.err
			if err == nil && b.next != len(b.calls) {
				err = fmt.Errorf("postgres: %d results for %d statements", b.next, len(b.calls))
			}
			b.deliver(b.version, err)
		}
	}
}

// head is the batch whose results come next.
func (p *pipe) head() *sentBatch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sent) == 0 {
		return nil
	}
	return p.sent[0]
}

// pop takes the head batch off, moving the read deadline to the next one.
func (p *pipe) pop() *sentBatch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sent) == 0 {
		return nil
	}
	b := p.sent[0]
	p.sent[0] = nil
	p.sent = p.sent[1:]
	if len(p.sent) == 0 {
		_ = p.conn.SetReadDeadline(time.Time{})
	} else {
		_ = p.conn.SetReadDeadline(time.Now().Add(batchTimeout))
	}
	return b
}

// deliverAll delivers every batch in flight after the connection broke:
// not sent, or sent with an unknown outcome.
func (p *pipe) deliverAll() {
	p.mu.Lock()
	sent, cause := p.sent, p.err
	p.sent = nil
	p.mu.Unlock()
	for _, b := range sent {
		err := b.err
		if b.unsent {
			err = notSent{cause}
		} else if err == nil {
			err = fmt.Errorf("postgres: the connection broke before the result (a commit may or may not have happened): %w", cause)
		}
		b.deliver(0, err)
	}
}

// batcher queues requests sent in batches, at most a given number in
// flight (the commit and read connections' queues).
type batcher[T any] struct {
	mu       sync.Mutex
	queue    []T
	front    int // how many at the queue's head were added by addFront
	inflight int // batches in flight
}

func (b *batcher[T]) add(r T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queue = append(b.queue, r)
}

// addFront queues r ahead of every queued request (the liveness lane's),
// behind the others of the lane queued before it.
func (b *batcher[T]) addFront(r T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queue = slices.Insert(b.queue, b.front, r)
	b.front++
}

// take takes the next batch (up to maxBatch requests) and counts it in
// flight, unless maxInFlight batches are in flight, or one is and fewer
// than minPipelined requests wait (nil). Every request is in exactly one
// of the queue or a batch.
func (b *batcher[T]) take(maxInFlight, minPipelined int) []T {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflight >= maxInFlight || len(b.queue) == 0 || (b.inflight > 0 && len(b.queue) < minPipelined) {
		return nil
	}
	n := min(len(b.queue), maxBatch)
	batch := slices.Clone(b.queue[:n])
	b.queue = b.queue[n:]
	b.front = max(0, b.front-n)
	b.inflight++
	return batch
}

// ended counts a batch out of flight.
func (b *batcher[T]) ended() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight--
}

// state is how many batches are in flight and requests queued.
func (b *batcher[T]) state() (batches, queued int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inflight, len(b.queue)
}
