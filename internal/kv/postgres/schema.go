package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrSchemaTooNew is returned by Open when the database holds a schema
// written by a newer couchrep than this one.
var ErrSchemaTooNew = errors.New("postgres: the job store's schema is newer than this couchrep supports; upgrade couchrep")

// migrations are the schema's versions, applied in order on first use.
// Append; never edit a released one.
//
// Tables:
//   - couchrep_kv: the ordered byte keys and values, and ver, the commit
//     version that last wrote each row (read-set validation compares it
//     with the reading transaction's snapshot version);
//   - couchrep_kv_meta: one row; cur is the newest commit version (its row
//     lock orders commits: versionstamps are commit-ordered), gc the
//     version below which couchrep_kv_clears was pruned;
//   - couchrep_kv_clears: what each recent commit cleared, so that
//     validation sees deletions in a read set (a deleted row has no ver).
var migrations = []string{
	1: `
CREATE TABLE couchrep_kv (
	k   bytea PRIMARY KEY,
	v   bytea NOT NULL,
	ver bigint NOT NULL
);
CREATE TABLE couchrep_kv_meta (
	id  int PRIMARY KEY CHECK (id = 1),
	cur bigint NOT NULL,
	gc  bigint NOT NULL
);
INSERT INTO couchrep_kv_meta VALUES (1, 0, 0);
CREATE TABLE couchrep_kv_clears (
	ver bigint NOT NULL,
	b   bytea NOT NULL,
	e   bytea NOT NULL
);
CREATE INDEX couchrep_kv_clears_ver ON couchrep_kv_clears (ver);

-- FDB's atomic ADD: little-endian two's-complement addition of d to a,
-- a zero-extended or truncated to d's length, wrapping on overflow.
CREATE FUNCTION couchrep_kv_add(a bytea, d bytea) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
	r bytea := d;
	c int := 0;
	s int;
BEGIN
	FOR i IN 0 .. length(d) - 1 LOOP
		s := get_byte(d, i) + c;
		IF i < length(a) THEN
			s := s + get_byte(a, i);
		END IF;
		r := set_byte(r, i, s & 255);
		c := s >> 8;
	END LOOP;
	RETURN r;
END $$;

-- The commit of one transaction, in one statement run in its own
-- READ COMMITTED transaction: take the next commit version (the meta row's
-- lock serializes commits, so every statement below sees every earlier
-- commit and no later one), fail with SQLSTATE 40001 if a commit after
-- the snapshot (version snap) wrote a key the transaction read, apply the
-- writes, and notify the watchers.
CREATE FUNCTION couchrep_kv_commit(
	snap bigint, rk bytea[], rb bytea[], re bytea[],
	cb bytea[], ce bytea[], ck bytea[], sk bytea[], sv bytea[], ak bytea[], ad bytea[],
	vk bytea[], vo int[], vv bytea[], xk bytea[], xo int[], xv bytea[], note text,
	OUT o_version bigint, OUT o_xv bytea[])
LANGUAGE plpgsql AS $$
DECLARE
	gcv bigint;
	stamp bytea;
BEGIN
	UPDATE couchrep_kv_meta SET cur = cur + 1,
		gc = CASE WHEN (cur + 1) % 1024 = 0 THEN greatest(gc, cur + 1 - 100000) ELSE gc END
	WHERE id = 1 RETURNING cur, gc INTO o_version, gcv;
	IF cardinality(rk) > 0 OR cardinality(rb) > 0 THEN
		IF snap < gcv THEN
			RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'couchrep: transaction too old to validate';
		END IF;
		IF EXISTS (SELECT 1 FROM couchrep_kv WHERE k = ANY (rk) AND ver > snap)
			OR EXISTS (SELECT 1 FROM unnest(rb, re) AS r(b, e)
				WHERE EXISTS (SELECT 1 FROM couchrep_kv kv WHERE kv.k >= r.b AND kv.k < r.e AND kv.ver > snap))
			OR EXISTS (SELECT 1 FROM couchrep_kv_clears c WHERE c.ver > snap
				AND (EXISTS (SELECT 1 FROM unnest(rk) AS x(k) WHERE x.k >= c.b AND x.k < c.e)
					OR EXISTS (SELECT 1 FROM unnest(rb, re) AS r(b, e) WHERE r.b < c.e AND c.b < r.e)))
		THEN
			RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'couchrep: read conflict';
		END IF;
	END IF;
	IF o_version % 1024 = 0 THEN
		DELETE FROM couchrep_kv_clears WHERE ver <= gcv;
	END IF;
	stamp := int8send(o_version) || '\x0000'::bytea;
	IF cardinality(cb) > 0 THEN
		DELETE FROM couchrep_kv kv USING unnest(cb, ce) AS r(b, e) WHERE kv.k >= r.b AND kv.k < r.e;
		INSERT INTO couchrep_kv_clears SELECT o_version, r.b, r.e FROM unnest(cb, ce) AS r(b, e);
	END IF;
	IF cardinality(ck) > 0 THEN
		DELETE FROM couchrep_kv WHERE k = ANY (ck);
		INSERT INTO couchrep_kv_clears SELECT o_version, x.k, x.k || '\x00'::bytea FROM unnest(ck) AS x(k);
	END IF;
	IF cardinality(sk) > 0 THEN
		INSERT INTO couchrep_kv (k, v, ver) SELECT x.k, x.v, o_version FROM unnest(sk, sv) AS x(k, v)
		ON CONFLICT (k) DO UPDATE SET v = excluded.v, ver = excluded.ver;
	END IF;
	IF cardinality(ak) > 0 THEN
		INSERT INTO couchrep_kv (k, v, ver) SELECT x.k, x.d, o_version FROM unnest(ak, ad) AS x(k, d)
		ON CONFLICT (k) DO UPDATE SET v = couchrep_kv_add(couchrep_kv.v, excluded.v), ver = excluded.ver;
	END IF;
	IF cardinality(vk) > 0 THEN
		INSERT INTO couchrep_kv (k, v, ver)
		SELECT overlay(x.k PLACING stamp FROM x.o + 1), x.v, o_version FROM unnest(vk, vo, vv) AS x(k, o, v)
		ON CONFLICT (k) DO UPDATE SET v = excluded.v, ver = excluded.ver;
	END IF;
	IF cardinality(xk) > 0 THEN
		o_xv := ARRAY(SELECT overlay(x.v PLACING stamp FROM x.o + 1) FROM unnest(xk, xo, xv) WITH ORDINALITY AS x(k, o, v, n) ORDER BY x.n);
		INSERT INTO couchrep_kv (k, v, ver) SELECT x.k, x.v, o_version FROM unnest(xk, o_xv) AS x(k, v)
		ON CONFLICT (k) DO UPDATE SET v = excluded.v, ver = excluded.ver;
	END IF;
	IF note IS NOT NULL THEN
		PERFORM pg_notify('couchrep_kv', note);
	END IF;
END $$;
`,
	// 2: group commit. couchrep_kv_lock takes the next commit version for a
	// batch of transactions sent together by one node; couchrep_kv_apply
	// validates and applies one of them (a conflict returns false and
	// writes nothing), its versionstamp ordered by its place in the batch.
	2: `
DROP FUNCTION couchrep_kv_commit;

CREATE FUNCTION couchrep_kv_lock(OUT o_version bigint)
LANGUAGE plpgsql AS $$
DECLARE
	gcv bigint;
BEGIN
	UPDATE couchrep_kv_meta SET cur = cur + 1,
		gc = CASE WHEN (cur + 1) % 1024 = 0 THEN greatest(gc, cur + 1 - 100000) ELSE gc END
	WHERE id = 1 RETURNING cur, gc INTO o_version, gcv;
	IF o_version % 1024 = 0 THEN
		DELETE FROM couchrep_kv_clears WHERE ver <= gcv;
	END IF;
END $$;

CREATE FUNCTION couchrep_kv_apply(
	ord int, snap bigint, rk bytea[], rb bytea[], re bytea[],
	cb bytea[], ce bytea[], ck bytea[], sk bytea[], sv bytea[], ak bytea[], ad bytea[],
	vk bytea[], vo int[], vv bytea[], xk bytea[], xo int[], xv bytea[], note text,
	OUT o_ok boolean, OUT o_xv bytea[])
LANGUAGE plpgsql AS $$
DECLARE
	v_version bigint;
	gcv bigint;
	stamp bytea;
BEGIN
	-- The batch's version: couchrep_kv_lock ran first in this transaction.
	SELECT cur, gc INTO v_version, gcv FROM couchrep_kv_meta WHERE id = 1;
	o_ok := false;
	IF cardinality(rk) > 0 OR cardinality(rb) > 0 THEN
		IF snap < gcv THEN
			RETURN;
		END IF;
		IF EXISTS (SELECT 1 FROM couchrep_kv WHERE k = ANY (rk) AND ver > snap)
			OR EXISTS (SELECT 1 FROM unnest(rb, re) AS r(b, e)
				WHERE EXISTS (SELECT 1 FROM couchrep_kv kv WHERE kv.k >= r.b AND kv.k < r.e AND kv.ver > snap))
			OR EXISTS (SELECT 1 FROM couchrep_kv_clears c WHERE c.ver > snap
				AND (EXISTS (SELECT 1 FROM unnest(rk) AS x(k) WHERE x.k >= c.b AND x.k < c.e)
					OR EXISTS (SELECT 1 FROM unnest(rb, re) AS r(b, e) WHERE r.b < c.e AND c.b < r.e)))
		THEN
			RETURN;
		END IF;
	END IF;
	o_ok := true;
	stamp := int8send(v_version) || int2send(ord::smallint);
	IF cardinality(cb) > 0 THEN
		DELETE FROM couchrep_kv kv USING unnest(cb, ce) AS r(b, e) WHERE kv.k >= r.b AND kv.k < r.e;
		INSERT INTO couchrep_kv_clears SELECT v_version, r.b, r.e FROM unnest(cb, ce) AS r(b, e);
	END IF;
	IF cardinality(ck) > 0 THEN
		DELETE FROM couchrep_kv WHERE k = ANY (ck);
		INSERT INTO couchrep_kv_clears SELECT v_version, x.k, x.k || '\x00'::bytea FROM unnest(ck) AS x(k);
	END IF;
	IF cardinality(sk) > 0 THEN
		INSERT INTO couchrep_kv (k, v, ver) SELECT x.k, x.v, v_version FROM unnest(sk, sv) AS x(k, v)
		ON CONFLICT (k) DO UPDATE SET v = excluded.v, ver = excluded.ver;
	END IF;
	IF cardinality(ak) > 0 THEN
		INSERT INTO couchrep_kv (k, v, ver) SELECT x.k, x.d, v_version FROM unnest(ak, ad) AS x(k, d)
		ON CONFLICT (k) DO UPDATE SET v = couchrep_kv_add(couchrep_kv.v, excluded.v), ver = excluded.ver;
	END IF;
	IF cardinality(vk) > 0 THEN
		INSERT INTO couchrep_kv (k, v, ver)
		SELECT overlay(x.k PLACING stamp FROM x.o + 1), x.v, v_version FROM unnest(vk, vo, vv) AS x(k, o, v)
		ON CONFLICT (k) DO UPDATE SET v = excluded.v, ver = excluded.ver;
	END IF;
	IF cardinality(xk) > 0 THEN
		o_xv := ARRAY(SELECT overlay(x.v PLACING stamp FROM x.o + 1) FROM unnest(xk, xo, xv) WITH ORDINALITY AS x(k, o, v, n) ORDER BY x.n);
		INSERT INTO couchrep_kv (k, v, ver) SELECT x.k, x.v, v_version FROM unnest(xk, o_xv) AS x(k, v)
		ON CONFLICT (k) DO UPDATE SET v = excluded.v, ver = excluded.ver;
	END IF;
	IF note IS NOT NULL THEN
		PERFORM pg_notify('couchrep_kv', note);
	END IF;
END $$;
`,
	// 3: the validation's plans never scan couchrep_kv_clears whole.
	// PL/pgSQL keeps a generic plan per connection, made from the table's
	// size when first run: made while the clears log was small, it
	// sequentially scanned the log (up to 100,000 commits of clears) at
	// every commit, 0.4 ms and growing (BENCHMARKS.md "PostgreSQL"). Every
	// statement of couchrep_kv_apply has an index to use.
	3: `
ALTER FUNCTION couchrep_kv_apply SET enable_seqscan = off;
`,
}

// SchemaVersion is the schema version this build writes and reads.
func SchemaVersion() int { return len(migrations) - 1 }

// schemaLock is the advisory lock key that serializes migrations of one
// database between nodes starting at once.
const schemaLock = 0x636f756368726570 // "couchrep"

// migrate creates or upgrades the schema, refusing one newer than this
// build's.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(schemaLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS couchrep_schema (
			version int PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
			return err
		}
		var cur int
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM couchrep_schema").Scan(&cur); err != nil {
			return err
		}
		if cur > SchemaVersion() {
			return fmt.Errorf("%w (the database has schema version %d, this build knows up to %d)", ErrSchemaTooNew, cur, SchemaVersion())
		}
		for v := cur + 1; v <= SchemaVersion(); v++ {
			if _, err := tx.Exec(ctx, migrations[v]); err != nil {
				return fmt.Errorf("schema migration %d: %w", v, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO couchrep_schema (version) VALUES ($1)", v); err != nil {
				return err
			}
		}
		return nil
	})
}
