package docproc

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/kv"
)

// TestForgetUnwatched: a server no node watches any more loses its
// documents' jobs and the doc processor's records, checkpoints and leases
// at start-up; a server this node, another node's recorded watch list or
// another node's live lease names keeps them. A node with no watch list
// forgets too. Jobs of a server the doc processor never knew (added through
// the store) are not its own: they stay.
func TestForgetUnwatched(t *testing.T) {
	const (
		mine     = "http://mine:5984"
		gone     = "http://gone:5984"
		others   = "http://others:5984"
		leased   = "http://leased:5984"
		expired  = "http://expired:5984"
		onlyJobs = "http://onlyjobs:5984"
		// listed only in this node's previous watch list (it had no
		// _replicator database yet, or its feed never checkpointed).
		listed = "http://listedonly:5984"
	)
	now := time.Unix(1_800_000_000, 0)
	cases := []struct {
		name    string
		servers []string
		forgot  []string
	}{
		{"some watched", []string{mine}, []string{expired, gone, listed}},
		{"none watched", nil, []string{expired, gone, listed, mine}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			store := nopStore(t)
			fj := newFakeJobs()
			p, err := New(Options{Servers: tc.servers, Node: "n1", Store: store, Jobs: fj, Logger: zerolog.Nop(),
				Clock: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			all := []string{mine, gone, others, leased, expired}
			for _, s := range append(all, onlyJobs, listed) {
				if _, err := fj.AddPersistent(ctx, s, "_replicator", "d1", json.RawMessage(`{}`)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := fj.AddPersistent(ctx, gone, "a/_replicator", "d2", json.RawMessage(`{}`)); err != nil {
				t.Fatal(err)
			}
			err = store.Transact(ctx, func(tx kv.Tx) error {
				for _, s := range all {
					tx.Set(p.keys.seq(s, "_replicator"), []byte(`"1-abc"`))
					if err := setJSON(tx, p.keys.doc(s, "_replicator", "d1"), DocRecord{JobID: s + "|_replicator|d1", Fingerprint: "f"}); err != nil {
						return err
					}
				}
				// This node's old lease on a server it no longer watches
				// does not keep it; another node's live lease does, an
				// expired one does not.
				for s, l := range map[string]lease{
					gone:    {Owner: "n1", Expires: now.Add(time.Minute).UnixNano()},
					leased:  {Owner: "n2", Expires: now.Add(time.Minute).UnixNano()},
					expired: {Owner: "n2", Expires: now.Add(-time.Second).UnixNano()},
				} {
					if err := setJSON(tx, p.keys.lease(s, "_replicator"), l); err != nil {
						return err
					}
				}
				// This node's own earlier list names gone: it is replaced.
				if err := setJSON(tx, p.keys.watching("n1"), watchRecord{Servers: []string{mine, gone, listed}}); err != nil {
					return err
				}
				return setJSON(tx, p.keys.watching("n3"), watchRecord{Servers: []string{others + "/"}})
			})
			if err != nil {
				t.Fatal(err)
			}

			got, err := p.ForgetUnwatched(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, f := range got {
				names = append(names, f.Server)
				want := 1
				if f.Server == gone {
					want = 2
				}
				if f.Jobs != want {
					t.Errorf("%s: %d jobs removed, want %d", f.Server, f.Jobs, want)
				}
			}
			if !slices.Equal(names, tc.forgot) {
				t.Fatalf("forgotten %v, want %v", names, tc.forgot)
			}
			for _, s := range append(all, onlyJobs, listed) {
				forgotten := slices.Contains(tc.forgot, s)
				_, jerr := fj.Get(ctx, s+"|_replicator|d1")
				if (jerr == nil) == forgotten {
					t.Errorf("%s: job present %v, want %v", s, jerr == nil, !forgotten)
				}
				if s == onlyJobs || s == listed {
					continue
				}
				var seq, doc, ls []byte
				err := store.ReadTransact(ctx, func(tx kv.ReadTx) error {
					var err error
					if seq, err = tx.Get(p.keys.seq(s, "_replicator")); err != nil {
						return err
					}
					if doc, err = tx.Get(p.keys.doc(s, "_replicator", "d1")); err != nil {
						return err
					}
					ls, err = tx.Get(p.keys.lease(s, "_replicator"))
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				if (seq == nil) != forgotten || (doc == nil) != forgotten || forgotten && ls != nil {
					t.Errorf("%s: seq %q doc %q lease %q, forgotten %v", s, seq, doc, ls, forgotten)
				}
			}
			// The node's own list is what it watches now.
			var rec watchRecord
			err = store.ReadTransact(ctx, func(tx kv.ReadTx) error {
				v, err := tx.Get(p.keys.watching("n1"))
				if err == nil {
					err = json.Unmarshal(v, &rec)
				}
				return err
			})
			if err != nil || !slices.Equal(rec.Servers, tc.servers) && len(rec.Servers)+len(tc.servers) > 0 {
				t.Fatalf("n1's watch list %v %v, want %v", rec.Servers, err, tc.servers)
			}
			// A second start forgets nothing more.
			if again, err := p.ForgetUnwatched(ctx); err != nil || len(again) != 0 {
				t.Fatalf("second run: %v %v, want nothing", again, err)
			}
		})
	}
}
