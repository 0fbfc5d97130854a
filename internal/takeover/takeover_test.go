package takeover_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/takeover"
	"github.com/couchrep/couchrep/internal/takeover/takeovertest"
)

var now = time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)

const (
	running = `{"total_rows":3,"offset":0,"docs":[
		{"database":"_replicator","doc_id":"a","state":"running"},
		{"database":"_replicator","doc_id":"b","state":"crashing"},
		{"database":"_replicator","doc_id":"c","state":"pending"},
		{"database":"_users","doc_id":"e","state":"running"}]}`
	replicationTask = `[{"type":"indexer"},{"type":"replication","doc_id":"a"}]`
)

// otherStore is a marker another store refreshed at t.
func otherStore(t time.Time) string {
	return fmt.Sprintf(`{"stores":{"0ther5t0re":{"node":"n9","updated":%q,"every_s":30}}}`, t.Format(time.RFC3339))
}

func prober(t *testing.T, f *takeovertest.Fake) takeover.Prober {
	t.Helper()
	// Credentials in the URL never show in facts, verdicts or checks.
	ep, err := couch.ParseEndpoint(strings.Replace(f.URL, "http://", "http://admin:s3cret@", 1))
	if err != nil {
		t.Fatal(err)
	}
	return takeover.Prober{Endpoint: ep, StoreID: "m1n3", Clock: func() time.Time { return now }}
}

func TestProbe(t *testing.T) {
	type want struct {
		status     string
		serverWide bool
		reason     string
		// results of Checks, by name; next a part of the failing checks'
		// next steps.
		results map[string]string
		next    string
	}
	off := `{"max_jobs":"0"}`
	for _, tc := range []struct {
		name string
		set  func(f *takeovertest.Fake)
		want want
	}{
		{"CouchDB replicator on, idle (max_jobs 500)", func(f *takeovertest.Fake) {},
			want{takeover.StatusCompeting, true, "max_jobs = 500", map[string]string{"replicator": "fail", "tasks": "ok", "scheduler": "ok", "other_stores": "ok", "uuid": "ok"},
				`curl -u ADMIN -X PUT ` + "URL" + `/_node/_local/_config/replicator/max_jobs -d '"0"'`}},
		{"max_jobs not set: CouchDB's default", func(f *takeovertest.Fake) { f.NodeConfig = `{"interval":"60000"}` },
			want{takeover.StatusCompeting, true, "default 500", map[string]string{"replicator": "fail"}, "max_jobs = 0"}},
		{"max_jobs 0, jobs still running", func(f *takeovertest.Fake) { f.NodeConfig = off; f.Scheduler = running; f.Tasks = replicationTask },
			want{takeover.StatusCompeting, true, "1 replication task", map[string]string{"replicator": "ok", "tasks": "fail", "scheduler": "fail"}, "wait until CouchDB has stopped its jobs"}},
		{"stopped: max_jobs 0, nothing runs", func(f *takeovertest.Fake) { f.NodeConfig = off },
			want{takeover.StatusNone, false, "max_jobs = 0", map[string]string{"replicator": "ok", "tasks": "ok", "scheduler": "ok", "other_stores": "ok", "uuid": "ok", "watched": "ok"}, ""}},
		{"another couchrep store's live marker", func(f *takeovertest.Fake) {
			f.NodeConfig = off
			f.Markers = map[string]string{"_replicator": otherStore(now.Add(-10 * time.Second))}
		}, want{takeover.StatusCompeting, false, "store 0ther5t0re (node n9)", map[string]string{"other_stores": "fail", "replicator": "ok"}, "stop that store's nodes"}},
		{"another store's stale marker", func(f *takeovertest.Fake) {
			f.NodeConfig = off
			f.Markers = map[string]string{"_replicator": otherStore(now.Add(-time.Hour))}
		}, want{takeover.StatusNone, false, "", map[string]string{"other_stores": "ok"}, ""}},
		{"our own marker is no competitor", func(f *takeovertest.Fake) {
			f.NodeConfig = off
			f.Markers = map[string]string{"_replicator": fmt.Sprintf(`{"stores":{"m1n3":{"node":"n1","updated":%q,"every_s":30}}}`, now.Format(time.RFC3339))}
		}, want{takeover.StatusNone, false, "", map[string]string{"other_stores": "ok"}, ""}},
		{"PouchDB Server: no _node config, _config without max_jobs", func(f *takeovertest.Fake) {
			f.NodeConfig, f.OldConfig, f.Scheduler = "", `{"db":"_replicator"}`, ""
		}, want{takeover.StatusUnknown, false, "has no max_jobs", map[string]string{"replicator": "unknown", "scheduler": "ok", "tasks": "ok"},
			`curl -u ADMIN -X PUT URL/_config/replicator/max_jobs -d '"0"'`}},
		{"PouchDB Server with max_jobs 0 in _config", func(f *takeovertest.Fake) {
			f.NodeConfig, f.OldConfig, f.Scheduler = "", `{"db":"_replicator","max_jobs":"0"}`, ""
		}, want{takeover.StatusNone, false, "", map[string]string{"replicator": "ok", "scheduler": "ok"}, ""}},
		{"PouchDB Server with max_jobs 500 in _config", func(f *takeovertest.Fake) {
			f.NodeConfig, f.OldConfig, f.Scheduler = "", `{"db":"_replicator","max_jobs":"500"}`, ""
		}, want{takeover.StatusCompeting, true, "max_jobs = 500 (/_config/replicator)", map[string]string{"replicator": "fail"},
			`curl -u ADMIN -X PUT URL/_config/replicator/max_jobs -d '"0"'`}},
		{"no config at all", func(f *takeovertest.Fake) { f.NodeConfig, f.OldConfig = "", "" },
			want{takeover.StatusUnknown, false, "unknown", map[string]string{"replicator": "unknown"}, "max_jobs = 0"}},
		{"not an admin", func(f *takeovertest.Fake) { f.Status = 401 },
			want{takeover.StatusUnknown, false, "server-admin credentials", map[string]string{"replicator": "unknown", "tasks": "unknown", "scheduler": "unknown", "other_stores": "unknown", "uuid": "unknown"}, "admin"}},
		{"another uuid", func(f *takeovertest.Fake) { f.NodeConfig = off; f.UUID = "other-uuid" },
			want{takeover.StatusNone, false, "", map[string]string{"uuid": "fail"}, "--adopt-uuid URL"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := takeovertest.New(t)
			f.Set(tc.set)
			p := prober(t, f)
			facts := p.Probe(context.Background(), nil)
			v := takeover.Assess(facts, now)
			if v.Status != tc.want.status || v.ServerWide != tc.want.serverWide || !strings.Contains(v.Reason, tc.want.reason) {
				t.Fatalf("verdict %+v, want %s server-wide %v reason ~%q", v, tc.want.status, tc.want.serverWide, tc.want.reason)
			}
			checks := takeover.Checks(facts, takeover.Want{UUID: "couchdb-uuid", Watched: true, Node: "n1"}, now)
			got := map[string]takeover.Check{}
			var next []string
			for _, c := range checks {
				got[c.Name] = c
				if c.Result != takeover.ResultOK {
					next = append(next, c.Next)
					if c.Next == "" {
						t.Errorf("check %s is %s without a next step", c.Name, c.Result)
					}
				} else if c.Next != "" {
					t.Errorf("check %s is ok with a next step %q", c.Name, c.Next)
				}
			}
			for name, res := range tc.want.results {
				if got[name].Result != res {
					t.Errorf("check %s: %+v, want %s", name, got[name], res)
				}
			}
			base := strings.TrimSuffix(f.URL, "/")
			wantNext := strings.ReplaceAll(tc.want.next, "URL", base)
			if all := strings.Join(next, "\n"); !strings.Contains(all, wantNext) {
				t.Errorf("next steps %q lack %q", all, wantNext)
			}
			if takeover.Ready(checks) != (tc.want.next == "") {
				t.Errorf("Ready = %v with next steps %q", takeover.Ready(checks), next)
			}
			b, _ := json.Marshal([]any{facts, v, checks})
			if strings.Contains(string(b), "s3cret") {
				t.Fatalf("credentials in the output: %s", b)
			}
		})
	}
}

func TestProbeNotWatched(t *testing.T) {
	f := takeovertest.New(t)
	checks := takeover.Checks(prober(t, f).Probe(context.Background(), nil), takeover.Want{UUID: "couchdb-uuid", Node: "n1"}, now)
	if checks[0].Name != "watched" || checks[0].Result != takeover.ResultFail || !strings.Contains(checks[0].Next, "[couchrep] watch") {
		t.Fatalf("%+v", checks[0])
	}
}

func TestMark(t *testing.T) {
	f := takeovertest.New(t)
	f.Set(func(f *takeovertest.Fake) { f.DBs = []string{"_replicator", "a/_replicator"} })
	f.PutMarker("a/_replicator", otherStore(now))
	mine, theirs := prober(t, f), prober(t, f)
	theirs.StoreID = "0ther5t0re"
	ctx := context.Background()
	for _, db := range []string{"_replicator", "a/_replicator"} {
		if err := mine.Mark(ctx, db, "n1", "couchdb-uuid", 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// Twice: a refresh replaces the entry (the current _rev is sent).
	if err := mine.Mark(ctx, "_replicator", "n2", "couchdb-uuid", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Stores map[string]map[string]any `json:"stores"`
	}
	if err := json.Unmarshal([]byte(f.Marker("a/_replicator")), &doc); err != nil || len(doc.Stores) != 2 {
		t.Fatalf("a/_replicator's marker keeps both stores: %s (%v)", f.Marker("a/_replicator"), err)
	}
	// The other store sees this one in both databases, this one sees the
	// other in one; neither sees itself.
	m := theirs.Probe(ctx, nil).Markers
	if !m.Known || len(m.Live()) != 2 || m.Live()[0].Store != "m1n3" || m.Live()[0].Node != "n2" {
		t.Fatalf("their view: %+v", m)
	}
	m = mine.Probe(ctx, nil).Markers
	if len(m.Live()) != 1 || m.Live()[0].DB != "a/_replicator" || m.Live()[0].Store != "0ther5t0re" {
		t.Fatalf("my view: %+v", m)
	}
	// Probing given databases reads only theirs.
	if m := mine.Probe(ctx, []string{"_replicator"}).Markers; len(m.Others) != 0 {
		t.Fatalf("given databases: %+v", m)
	}
	if err := mine.Unmark(ctx, "a/_replicator"); err != nil {
		t.Fatal(err)
	}
	if m := theirs.Probe(ctx, nil).Markers; len(m.Live()) != 1 || m.Live()[0].DB != "_replicator" {
		t.Fatalf("after Unmark: %+v", m)
	}
}

func TestStoreID(t *testing.T) {
	ctx := context.Background()
	open := func(path string) *sqlite.DB {
		db, err := sqlite.Open(ctx, path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	a, b := open(filepath.Join(t.TempDir(), "a.db")), open(filepath.Join(t.TempDir(), "b.db"))
	id1, err := takeover.StoreID(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	id2, _ := takeover.StoreID(ctx, a)
	id3, _ := takeover.StoreID(ctx, b)
	if id1 == "" || id1 != id2 || id1 == id3 {
		t.Fatalf("store ids %q %q (same store), %q (another)", id1, id2, id3)
	}
}
