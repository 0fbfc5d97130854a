package replicate

import (
	"strings"
	"testing"

	"github.com/couchrep/couchrep/internal/sharedfeed"
)

// TestFeedSharing checks which runs share a feed and with whom: only
// continuous runs with doc_ids or no filter share; two runs share exactly
// when everything that shapes the feed's request and connection is equal
// (not the doc_ids or the target), so different credentials never share;
// neither the key nor the feed's name in logs holds a credential.
func TestFeedSharing(t *testing.T) {
	const src = "http://u:secret@127.0.0.1:5984/db"
	hub := sharedfeed.New(sharedfeed.Options{})
	run := func(extra, source string) *Replication {
		r := New(fakeParams(t, extra, source, "http://127.0.0.1:5984/tgt"), Options{Feeds: hub})
		if err := r.openDBs(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	base := run(`,"continuous":true,"doc_ids":["a"]`, src)
	if !base.sharesFeed() {
		t.Fatal("a continuous doc_ids run does not share")
	}
	fs := base.feedSource()
	key := fs.Key
	if strings.Contains(key, "secret") || strings.Contains(key, "127.0.0.1") {
		t.Errorf("key %q shows the source", key)
	}
	if strings.Contains(fs.Name, "secret") || !strings.Contains(fs.Name, "127.0.0.1:5984/db") {
		t.Errorf("feed name for logs %q: want the database without its password", fs.Name)
	}
	for _, c := range []struct {
		name, extra, source string
		shares, same        bool
	}{
		{"other doc_ids", `,"continuous":true,"doc_ids":["b","c"]`, src, true, true},
		{"no filter", `,"continuous":true`, src, true, true},
		{"other target only", `,"continuous":true,"create_target":true`, src, true, true},
		{"other password", `,"continuous":true`, "http://u:other@127.0.0.1:5984/db", true, false},
		{"other user", `,"continuous":true`, "http://v:secret@127.0.0.1:5984/db", true, false},
		{"no credentials", `,"continuous":true`, "http://127.0.0.1:5984/db", true, false},
		{"other database", `,"continuous":true`, "http://u:secret@127.0.0.1:5984/db2", true, false},
		{"proxy", `,"continuous":true,"source_proxy":"http://127.0.0.1:3128"`, src, true, false},
		{"connection_timeout", `,"continuous":true,"connection_timeout":5000`, src, true, false},
		{"winning_revs_only", `,"continuous":true,"winning_revs_only":true`, src, true, false},
		{"one-shot", ``, src, false, false},
		{"selector", `,"continuous":true,"selector":{"a":1}`, src, false, false},
		{"named filter", `,"continuous":true,"filter":"d/f","query_params":{"x":1}`, src, false, false},
	} {
		r := run(c.extra, c.source)
		if got := r.sharesFeed(); got != c.shares {
			t.Errorf("%s: shares = %v, want %v", c.name, got, c.shares)
			continue
		}
		if c.shares {
			if same := r.feedSource().Key == key; same != c.same {
				t.Errorf("%s: same feed as the base = %v, want %v", c.name, same, c.same)
			}
		}
	}
}
