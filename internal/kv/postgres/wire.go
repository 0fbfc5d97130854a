package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The statements of every transaction (snapshot, reads, commit) go to the
// server through pgconn's batch (one Bind and Execute per statement, one
// Sync, one write) with their parameters encoded and their rows decoded
// here, in binary, for the few types they use. pgx's own batch (its
// pipeline's per-statement bookkeeping, reflection-driven array encoding,
// row scanning) cost about as much client CPU per job cycle as the round
// trips' system calls (BENCHMARKS.md "Go-process CPU per cycle").

// call is one statement of a round trip: its SQL (prepared once per
// connection under a name of this package), its arguments, and what
// takes each of its rows (nil: rows are not expected or not wanted).
type call struct {
	sql  string
	args []any
	// apply, instead of args: the arguments of a commit's apply
	// statement, encoded from its fields (no []any of them on the heap).
	apply *commitArgs
	order int32 // apply's place in its batch
	row   func(vals [][]byte) error
}

// stmtNames names the prepared statements, by SQL.
var stmtNames = map[string]string{}

func init() {
	for i, sql := range []string{"ROLLBACK", beginSQL, snapSQL, getSQL, fwdSQL, revSQL,
		firstGetSQL, firstFwdSQL, firstRevSQL, lockSQL, fastApplySQL, applySQL, cacheCheckSQL, autoGetSQL, autoCheckSQL, pruneSQL, manySQL} {
		stmtNames[sql] = "couchrep_" + strconv.Itoa(i)
	}
}

var binaryFormat = []int16{pgtype.BinaryFormatCode}

// run sends calls in one round trip on c and hands their rows to their
// row functions. The statements run up to the first error (a PgError for
// a statement the server refused); outside an explicit transaction they
// are one implicit transaction.
func run(ctx context.Context, c *pgx.Conn, calls []call) error {
	var b pgconn.Batch
	n := 0
	for _, cl := range calls {
		if cl.apply != nil {
			n += cl.apply.size()
		} else {
			n += argsSize(cl.args)
		}
	}
	buf := make([]byte, 0, n) // every parameter of the batch, one after another
	for _, cl := range calls {
		sd, err := prepare(ctx, c, cl.sql)
		if err != nil {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) {
				err = notSent{err} // nothing of calls ran
			}
			return err
		}
		var params [][]byte
		if cl.apply != nil {
			buf, params, err = cl.apply.encode(cl.order, sd.ParamOIDs, buf)
		} else {
			buf, params, err = encodeParams(sd.ParamOIDs, cl.args, buf)
		}
		if err != nil {
			return err
		}
		b.ExecStatement(sd, params, binaryFormat, binaryFormat)
	}
	mrr := c.PgConn().ExecBatch(ctx, &b)
	var err error
	n = 0
	for mrr.NextResult() {
		rr := mrr.ResultReader()
		for rr.NextRow() {
			if err == nil && n < len(calls) && calls[n].row != nil {
				err = calls[n].row(rr.Values())
			}
		}
		if _, cerr := rr.Close(); err == nil {
			err = cerr
		}
		n++
	}
	if cerr := mrr.Close(); cerr != nil {
		err = cerr
		var pe *pgconn.PgError
		if errors.As(cerr, &pe) && (pe.Code == "0A000" || pe.Code == "26000") {
			// A prepared statement the server no longer takes as it was
			// prepared ("cached plan must not change result type" after a
			// schema change, or gone): drop the connection, whose
			// statements pgx keeps; the pool replaces it.
			_ = c.PgConn().Close(context.Background())
		}
	}
	var oe *net.OpError
	if n == 0 && errors.As(err, &oe) && oe.Op == "write" {
		// The write of the batch failed: its Sync, its last message, was
		// not sent, so nothing of it was committed (the implicit
		// transaction of statements a partial write delivered rolls back
		// with the connection). pgx's own batch says the same of a write
		// that sent nothing.
		err = notSent{err}
	}
	if err == nil && n != len(calls) {
		err = fmt.Errorf("postgres: %d results for %d statements", n, len(calls))
	}
	return err
}

// notSent marks an error after which the statements were provably not
// committed (pgconn.SafeToRetry reports it).
type notSent struct{ err error }

func (e notSent) Error() string     { return e.err.Error() }
func (e notSent) Unwrap() error     { return e.err }
func (e notSent) SafeToRetry() bool { return true }

// prepare returns sql's statement on c, preparing it (one round trip)
// on first use; pgx keeps it per connection.
func prepare(ctx context.Context, c *pgx.Conn, sql string) (*pgconn.StatementDescription, error) {
	name, ok := stmtNames[sql]
	if !ok {
		return nil, fmt.Errorf("postgres: statement not registered: %.40q", sql)
	}
	return c.Prepare(ctx, name, sql)
}

// encodeParams appends args to buf, encoded in binary as the statement's
// parameter types (oids) say, and returns each one's bytes (nil: NULL).
func encodeParams(oids []uint32, args []any, buf []byte) ([]byte, [][]byte, error) {
	if len(oids) != len(args) {
		return buf, nil, fmt.Errorf("postgres: %d arguments for %d parameters", len(args), len(oids))
	}
	params := make([][]byte, len(args))
	for i, a := range args {
		var err error
		if buf, params[i], err = appendParam(buf, oids[i], a); err != nil {
			return buf, nil, fmt.Errorf("postgres: parameter $%d: %w", i+1, err)
		}
	}
	return buf, params, nil
}

// argsSize is about how many bytes args take encoded.
func argsSize(args []any) int {
	n := 0
	for _, a := range args {
		switch x := a.(type) {
		case []byte:
			n += len(x)
		case [][]byte:
			n += arraySize(x)
		default:
			n += 8
		}
	}
	return n
}

// arraySize is how many bytes a takes as a binary bytea[].
func arraySize(a [][]byte) int {
	n := 20
	for _, e := range a {
		n += 4 + len(e)
	}
	return n
}

// appendParam appends a, encoded in binary as type oid, to buf and
// returns buf and a's bytes in it (nil: a is NULL). The bytes stay valid
// when a later append moves buf.
func appendParam(buf []byte, oid uint32, a any) ([]byte, []byte, error) {
	start := len(buf)
	switch oid {
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID:
		var v int64
		switch x := a.(type) {
		case int:
			v = int64(x)
		case int32:
			v = int64(x)
		case int64:
			v = x
		default:
			return buf, nil, fmt.Errorf("%s for an integer", kindOf(a))
		}
		switch oid {
		case pgtype.Int2OID:
			if v < math.MinInt16 || v > math.MaxInt16 {
				return buf, nil, fmt.Errorf("%d out of smallint's range", v)
			}
			buf = binary.BigEndian.AppendUint16(buf, uint16(v))
		case pgtype.Int4OID:
			if v < math.MinInt32 || v > math.MaxInt32 {
				return buf, nil, fmt.Errorf("%d out of integer's range", v)
			}
			buf = binary.BigEndian.AppendUint32(buf, uint32(v))
		default:
			buf = binary.BigEndian.AppendUint64(buf, uint64(v))
		}
		return buf, buf[start:], nil
	case pgtype.ByteaOID:
		if b, ok := a.([]byte); ok {
			if b == nil {
				return buf, nil, nil
			}
			buf = append(buf, b...)
			return buf, buf[start:len(buf):len(buf)], nil
		}
	case pgtype.TextOID:
		switch x := a.(type) {
		case string:
			buf = append(buf, x...)
			return buf, buf[start:len(buf):len(buf)], nil
		case *string:
			if x == nil {
				return buf, nil, nil
			}
			buf = append(buf, *x...)
			return buf, buf[start:len(buf):len(buf)], nil
		}
	case pgtype.ByteaArrayOID:
		if x, ok := a.([][]byte); ok {
			buf = arrayHeader(buf, pgtype.ByteaOID, len(x))
			for _, e := range x {
				if e == nil {
					buf = binary.BigEndian.AppendUint32(buf, math.MaxUint32) // -1: NULL
					continue
				}
				buf = binary.BigEndian.AppendUint32(buf, uint32(len(e)))
				buf = append(buf, e...)
			}
			return buf, buf[start:len(buf):len(buf)], nil
		}
	case pgtype.Int4ArrayOID:
		if x, ok := a.([]int32); ok {
			buf = arrayHeader(buf, pgtype.Int4OID, len(x))
			for _, e := range x {
				buf = binary.BigEndian.AppendUint32(buf, 4)
				buf = binary.BigEndian.AppendUint32(buf, uint32(e))
			}
			return buf, buf[start:len(buf):len(buf)], nil
		}
	}
	return buf, nil, fmt.Errorf("no encoding of %s as type %d", kindOf(a), oid)
}

// kindOf names a's type for an error, among those appendParam takes
// (fmt's %T would move every argument to the heap).
func kindOf(a any) string {
	switch a.(type) {
	case nil:
		return "nil"
	case int, int32, int64:
		return "an integer"
	case []byte:
		return "[]byte"
	case string, *string:
		return "a string"
	case [][]byte:
		return "[][]byte"
	case []int32:
		return "[]int32"
	}
	return "an unsupported value"
}

// arrayHeader appends the binary array header of a one-dimensional array
// of n elements of type elem (no dimension at all when empty, as
// PostgreSQL writes '{}'). The header's null flag is 0: the server does
// not require it to be set for NULL elements.
func arrayHeader(b []byte, elem uint32, n int) []byte {
	if n == 0 {
		b = binary.BigEndian.AppendUint32(b, 0) // dimensions
		b = binary.BigEndian.AppendUint32(b, 0) // flags
		return binary.BigEndian.AppendUint32(b, elem)
	}
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, elem)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	return binary.BigEndian.AppendUint32(b, 1) // lower bound
}

// Decoders of binary result values (nil: NULL).

func decodeInt8(v []byte) (int64, error) {
	if len(v) != 8 {
		return 0, fmt.Errorf("postgres: bigint of %d bytes", len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

func decodeBool(v []byte) (bool, error) {
	if len(v) != 1 {
		return false, fmt.Errorf("postgres: boolean of %d bytes", len(v))
	}
	return v[0] != 0, nil
}

// decodeByteaArray decodes a one-dimensional bytea[] (NULL elements are
// nil; the array itself NULL: nil).
func decodeByteaArray(v []byte) ([][]byte, error) {
	if v == nil {
		return nil, nil
	}
	bad := func() ([][]byte, error) { return nil, fmt.Errorf("postgres: malformed bytea[] of %d bytes", len(v)) }
	if len(v) < 12 {
		return bad()
	}
	ndim, elem := binary.BigEndian.Uint32(v), binary.BigEndian.Uint32(v[8:])
	if ndim == 0 {
		return [][]byte{}, nil
	}
	if ndim != 1 || elem != pgtype.ByteaOID || len(v) < 20 {
		return bad()
	}
	n := int(binary.BigEndian.Uint32(v[12:]))
	v = v[20:]
	if n > len(v)/4 {
		return bad()
	}
	out := make([][]byte, n)
	for i := range out {
		if len(v) < 4 {
			return bad()
		}
		l := int32(binary.BigEndian.Uint32(v))
		v = v[4:]
		if l < 0 {
			continue
		}
		if int(l) > len(v) {
			return bad()
		}
		out[i] = append([]byte{}, v[:l]...)
		v = v[l:]
	}
	return out, nil
}
