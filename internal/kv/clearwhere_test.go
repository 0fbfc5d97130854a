package kv_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
)

// TestClearWhere runs kv.ClearWhere on a real store: it clears exactly the
// entries drop chose (within the limit), and nothing when drop fails.
func TestClearWhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "kv.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	boom := errors.New("boom")
	odd := func(e kv.KeyValue) (bool, error) { return e.Value[0]%2 == 1, nil }
	for _, tc := range []struct {
		name    string
		opts    kv.RangeOptions
		drop    func(kv.KeyValue) (bool, error)
		wantN   int
		wantErr error
		left    string
	}{
		{"odd values", kv.RangeOptions{}, odd, 3, nil, "[a0 a2 a4]"},
		{"limit", kv.RangeOptions{Limit: 2}, odd, 1, nil, "[a0 a2 a3 a4 a5]"},
		{"none", kv.RangeOptions{}, func(kv.KeyValue) (bool, error) { return false, nil }, 0, nil, "[a0 a1 a2 a3 a4 a5]"},
		{"drop fails", kv.RangeOptions{}, func(kv.KeyValue) (bool, error) { return true, boom }, 0, boom, "[a0 a1 a2 a3 a4 a5]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			begin, end := []byte(tc.name+"/"), []byte(tc.name+"0")
			key := func(i int) []byte { return fmt.Appendf(nil, "%s/a%d", tc.name, i) }
			if err := db.Transact(ctx, func(tx kv.Tx) error {
				for i := range 6 {
					tx.Set(key(i), []byte{byte(i)})
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			var n int
			err := db.Transact(ctx, func(tx kv.Tx) error {
				var err error
				n, err = kv.ClearWhere(tx, begin, end, tc.opts, tc.drop)
				return err
			})
			if n != tc.wantN || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("ClearWhere = %d, %v; want %d, %v", n, err, tc.wantN, tc.wantErr)
			}
			var left []string
			if err := db.ReadTransact(ctx, func(tx kv.ReadTx) error {
				keys, err := kv.Keys(tx.GetRange(begin, end, kv.RangeOptions{}))
				for _, k := range keys {
					left = append(left, string(k[len(begin):]))
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(left); got != tc.left {
				t.Fatalf("left %s, want %s", got, tc.left)
			}
		})
	}
}
