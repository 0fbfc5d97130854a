package postgres

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvtest"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
	"github.com/couchrep/couchrep/internal/kv/tuple"
	"github.com/couchrep/couchrep/internal/redact"
)

func TestMain(m *testing.M) {
	if kvtest.IsChild() {
		os.Exit(kvtest.RunChild(func(ctx context.Context, dsn string) (kv.Database, error) {
			return Open(ctx, dsn, Options{})
		}))
	}
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// openDB opens a store on dsn, closed when the test ends.
func openDB(t testing.TB, dsn string, opts Options) *DB {
	t.Helper()
	db, err := Open(context.Background(), dsn, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	srv := pgtest.Shared(t)
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"normal", Options{}},
		{"full", Options{Durability: kv.DurabilityFull}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := srv.NewDatabase(t)
			// Every case writes under a fresh prefix: one database serves all.
			kvtest.Run(t, func(t *testing.T) kv.Database { return openDB(t, dsn, tc.opts) })
		})
	}
}

func TestConformanceMultiProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	kvtest.RunMultiProcess(t, openDB(t, dsn, Options{}), dsn)
}

// TestSchema: the schema is created once, reopening keeps the data, and a
// database whose schema is newer than this build's is refused.
func TestSchema(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	key := []byte("k")
	// Nodes starting at once create the schema once.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			db, err := Open(context.Background(), dsn, Options{})
			if err == nil {
				err = db.Transact(context.Background(), func(tx kv.Tx) error { tx.Add(key, 1); return nil })
				db.Close()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	db := openDB(t, dsn, Options{})
	var n int64
	if err := db.ReadTransact(context.Background(), func(tx kv.ReadTx) error {
		v, err := tx.Get(key)
		n = kv.Int64LE(v)
		return err
	}); err != nil || n != 4 {
		t.Fatalf("counter after 4 concurrent first opens = %d, %v", n, err)
	}
	var versions int
	if err := db.pool.QueryRow(context.Background(), "SELECT count(*) FROM couchrep_schema").Scan(&versions); err != nil || versions != SchemaVersion() {
		t.Fatalf("couchrep_schema has %d rows (%v), want %d", versions, err, SchemaVersion())
	}
	if _, err := db.pool.Exec(context.Background(), "INSERT INTO couchrep_schema (version) VALUES ($1)", SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), dsn, Options{})
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Open of a newer schema: err = %v, want ErrSchemaTooNew", err)
	}
	if !strings.Contains(err.Error(), "upgrade couchrep") {
		t.Errorf("error %q does not say what to do", err)
	}
}

// TestPasswordNeverShown: errors and log lines of a store whose server
// refuses or goes away never contain the password.
func TestPasswordNeverShown(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := zerolog.New(zerolog.SyncWriter(&lockedWriter{&mu, &logs}))
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		if strings.Contains(err.Error(), pgtest.Password) {
			t.Fatalf("%s: error shows the password: %v", what, err)
		}
	}
	wrong := strings.Replace(dsn, pgtest.Password, pgtest.Password+"-wrong", 1)
	_, err := Open(context.Background(), wrong, Options{Logger: logger})
	check("wrong password", err)
	_, err = Open(context.Background(), "postgres://u:"+pgtest.Password+"@127.0.0.1:1/db?connect_timeout=2", Options{Logger: logger})
	check("no server", err)
	_, err = Open(context.Background(), "postgres://u:"+pgtest.Password+"@127.0.0.1:x/db", Options{Logger: logger})
	check("bad URL", err)

	db := openDB(t, dsn, Options{Logger: logger})
	if err := db.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	check("health check with the server down", db.Check(context.Background()))
	check("transaction with the server down", db.Transact(context.Background(), func(tx kv.Tx) error {
		_, err := tx.Get([]byte("k"))
		return err
	}))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// The pool and the listener reconnect.
	deadline := time.Now().Add(time.Minute)
	for db.Check(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("store still unhealthy a minute after the server came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), pgtest.Password) {
		t.Fatalf("log shows the password:\n%s", logs.String())
	}
	if got := redact.Text(dsn); strings.Contains(got, pgtest.Password) || !strings.Contains(got, redact.Mask) {
		t.Fatalf("Redact(dsn) = %q", got)
	}
	if got := redact.Text("host=h password='" + pgtest.Password + "' user=u"); strings.Contains(got, pgtest.Password) {
		t.Fatalf("Redact(key=value) = %q", got)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestWatchAcrossRestart: a watch set before the server restarts fires
// for a change committed after it came back (the listener reconnects and
// looks at the watched keys again).
func TestWatchAcrossRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	a, b := openDB(t, dsn, Options{}), openDB(t, dsn, Options{})
	s := tuple.NewSubspace(nil, tuple.Tuple{"w"})
	key := s.Pack(tuple.Tuple{"k"})
	var w kv.Watch
	if err := a.Transact(context.Background(), func(tx kv.Tx) error { w = tx.Watch(key); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		err := b.Transact(ctx, func(tx kv.Tx) error { tx.Set(key, []byte("after restart")); return nil })
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no commit after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := w.Wait(ctx); err != nil {
		t.Fatalf("watch set before the restart: %v", err)
	}
}

// TestAddHotCounter: concurrent transactions adding to one counter never
// conflict (Add is not a read) and lose no increment.
func TestAddHotCounter(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	db := openDB(t, pgtest.Shared(t).NewDatabase(t), Options{})
	key := []byte("hot")
	const workers, each = 8, 50
	var attempts sync.Map
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				n := 0
				if err := db.Transact(context.Background(), func(tx kv.Tx) error {
					n++
					tx.Add(key, 1)
					return nil
				}); err != nil {
					t.Error(err)
					return
				}
				attempts.Store([2]int{w, i}, n)
			}
		})
	}
	wg.Wait()
	retried := 0
	attempts.Range(func(_, v any) bool {
		if v.(int) > 1 {
			retried++
		}
		return true
	})
	if retried > 0 {
		t.Errorf("%d of %d Add transactions were retried: Add must not conflict", retried, workers*each)
	}
	var n int64
	if err := db.ReadTransact(context.Background(), func(tx kv.ReadTx) error {
		v, err := tx.Get(key)
		n = kv.Int64LE(v)
		return err
	}); err != nil || n != workers*each {
		t.Fatalf("counter = %d (%v), want %d", n, err, workers*each)
	}
}
