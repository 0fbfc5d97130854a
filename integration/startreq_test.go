package integration

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// startRequestsLog reads (and empties) the server's request log
// (count-requests.js with COUCHREP_COUNT_REQUESTS_LOG=1).
func (p *perUser) startRequestsLog(t testing.TB) []string {
	t.Helper()
	var r struct {
		Log []string `json:"log"`
	}
	p.srv.GetJSON(t, p.srv.URL+"_couchrep_requests?log=1&reset=1", &r)
	return r.Log
}

// startReqKind names a request of the server's log by what it does to
// which database: "<db> <kind>", db "user" (a user database), "central"
// or the node's own ("_replicator", "_db_updates", "/"); kind as
// replicatorRequestKind's ("GET db", "GET _local", "_changes normal",
// "_changes continuous", "_changes normal limit=1", "_bulk_docs",
// "_revs_diff", "_ensure_full_commit", "PUT _local", ...).
func startReqKind(line string) string {
	method, rawURL, _ := strings.Cut(line, " ")
	req, err := http.NewRequest(method, "http://x"+rawURL, nil)
	if err != nil {
		return line
	}
	path := strings.Trim(req.URL.Path, "/")
	db, _, _ := strings.Cut(path, "/")
	switch {
	case strings.HasPrefix(db, "userdb-"):
		db = "user"
	case db == "":
		db = "/"
	}
	kind := replicatorRequestKind(req)
	if strings.HasPrefix(kind, "_changes") && req.URL.Query().Get("limit") == "1" {
		kind += " limit=1"
	}
	if strings.HasPrefix(kind, "_changes") && req.URL.Query().Get("since") == "now" {
		kind += " since=now"
	}
	return db + " " + kind
}

// jobRequests counts the requests of the log that are the jobs' (those to
// user databases and to the central one, and POST /_session: none here,
// the test server's URLs carry no credentials) by startReqKind.
func jobRequests(log []string) map[string]int {
	out := map[string]int{}
	for _, l := range log {
		k := startReqKind(l)
		if strings.HasPrefix(k, "user ") || strings.HasPrefix(k, "central ") || k == "_session _session" {
			out[k]++
		}
	}
	return out
}

var ownDB = regexp.MustCompile(`^(GET|POST|PUT) /(_replicator|_db_updates|_users|_session|_up|_all_dbs)`)

// TestPerUserStartRequests asserts exactly which requests a per-user job
// makes from its start until it is parked, counted at the server (a
// PouchDB Server with a real _db_updates feed, its requests logged by
// count-requests.js), with one couchrepd watching its _replicator
// database (idle_park_after 2 s). Three jobs of one kind are written
// together in one _bulk_docs, in four cases, one after the other:
//
//   - fan-out (central → user database, selector {"owner": user}, the
//     central database's shared feed) while the central database is
//     empty, then while it holds three documents of each user;
//   - fan-in (user database → central, continuous) from empty user
//     databases, then from user databases of three documents each.
//
// What a start needs and nothing else: the source's info (the shared
// feed starts from it: no second read), the target's info (shared by the
// jobs started together), both checkpoints, the catch-up _changes only
// when the source has changes after the checkpoint, the feed, and, when
// something was written, the checkpoint; a job that wrote nothing parks
// without writing one.
func TestPerUserStartRequests(t *testing.T) {
	skipShort(t)
	t.Setenv("COUCHREP_COUNT_REQUESTS_LOG", "1")
	const k = 3
	p := newPerUserServer(t, 4*k)
	p.node, p.addr = scaleNode(t, 4*k, "COUCHREP_COUCHREP_WATCH="+strings.TrimSuffix(p.srv.URL, "/"),
		"COUCHREP_REPLICATOR_IDLE_PARK_AFTER=2")
	written := 0
	start := func(t *testing.T, users []string, doc func(u string) string) map[string]int {
		t.Helper()
		p.startRequestsLog(t)
		docs := make([]json.RawMessage, 0, len(users))
		for _, u := range users {
			docs = append(docs, json.RawMessage(doc(u)))
		}
		p.srv.Do(t, http.MethodPost, p.srv.DBURL("_replicator")+"_bulk_docs", map[string]any{"docs": docs}, http.StatusCreated)
		p.written = time.Now()
		written += len(users)
		p.jobs = written
		p.waitParked(t, 2*time.Minute)
		log := p.startRequestsLog(t)
		got := jobRequests(log)
		var lines []string
		for _, l := range log {
			if !ownDB.MatchString(l) {
				lines = append(lines, l)
			}
		}
		t.Logf("requests of %d jobs:\n%s", len(users), strings.Join(lines, "\n"))
		return got
	}
	fanOut := func(u string) string {
		return fmt.Sprintf(`{"_id":"out-%s","source":%q,"target":%q,"continuous":true,"selector":{"owner":%q}}`,
			u, p.central, p.srv.DBURL(perUserDB(u)), u)
	}
	fanIn := func(u string) string {
		return fmt.Sprintf(`{"_id":"in-%s","source":%q,"target":%q,"continuous":true}`, u, p.srv.DBURL(perUserDB(u)), p.central)
	}
	threeDocs := func(u string) []map[string]any {
		docs := make([]map[string]any, 3)
		for i := range docs {
			docs[i] = map[string]any{"_id": fmt.Sprintf("%s-%d", u, i), "owner": u}
		}
		return docs
	}
	// Per job: the source's and the target's checkpoints and the
	// user database's info; the central database's info is shared by
	// the jobs started together (InfoShareFor), so it is counted as at
	// most one per job (how many fewer depends on how close together the
	// jobs started: BENCHMARKS.md has it at 2,000 jobs). The central
	// database's shared feed (fan-out) is opened once, by the first job's
	// wake-up watch (with its own read of the central database's info).
	perJob := func(kinds ...string) map[string]int {
		m := map[string]int{}
		for _, kind := range kinds {
			m[kind] = k
		}
		return m
	}
	checkpoint := []string{"central _ensure_full_commit", "central PUT _local", "user _ensure_full_commit", "user PUT _local"}
	cases := []struct {
		name  string
		users []string
		doc   func(string) string
		setup func(users []string)
		// want are the exact counts; central GET db is at most
		// centralInfos.
		want         map[string]int
		extra        map[string]int
		centralInfos int
	}{
		{"fan-out from an empty central database", p.users[0:k], fanOut, nil,
			perJob("central GET _local", "user GET _local", "user GET db"),
			map[string]int{"central _changes continuous": 1}, k + 1},
		{"fan-out, three documents per user", p.users[k : 2*k], fanOut, func(users []string) {
			for _, u := range users {
				p.srv.PutDocs(t, p.central, threeDocs(u)...)
			}
		}, perJob(append([]string{"central GET _local", "user GET _local", "user GET db",
			"central _changes normal", "central _bulk_get", "user _bulk_docs"}, checkpoint...)...), nil, k},
		{"fan-in from empty user databases", p.users[2*k : 3*k], fanIn, nil,
			perJob("central GET _local", "user GET _local", "user GET db", "user _changes continuous"), nil, k},
		{"fan-in, three documents per user", p.users[3*k : 4*k], fanIn, func(users []string) {
			for _, u := range users {
				p.srv.PutDocs(t, p.srv.DBURL(perUserDB(u)), threeDocs(u)...)
			}
		}, perJob(append([]string{"central GET _local", "user GET _local", "user GET db", "user _changes continuous",
			"user _changes normal", "central _revs_diff", "user _bulk_get", "central _bulk_docs"}, checkpoint...)...), nil, k},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != nil {
				c.setup(c.users)
			}
			got := start(t, c.users, c.doc)
			want := maps.Clone(c.want)
			maps.Copy(want, c.extra)
			infos := got["central GET db"]
			delete(got, "central GET db")
			if !maps.Equal(got, want) || infos < 1 || infos > c.centralInfos {
				t.Errorf("%d jobs started with %s and %d central GET db, want %s and 1 to %d",
					k, sortedCounts(got), infos, sortedCounts(want), c.centralInfos)
			}
		})
	}
}

// sortedCounts formats m sorted by key.
func sortedCounts(m map[string]int) string {
	keys := slices.Sorted(maps.Keys(m))
	var sb strings.Builder
	sb.WriteString("{")
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%s: %d", k, m[k])
	}
	sb.WriteString("}")
	return sb.String()
}

// withCreds is u with user:pass as its userinfo.
func withCreds(u, user, pass string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	p.User = url.UserPassword(user, pass)
	return p.String()
}

// TestStartBurstSharesLoginAndInfo is docs/operations.md's promise under a
// burst of concurrent starts, counted at the server (count-requests.js's
// log): n _replicator documents written in one _bulk_docs, each a
// continuous fan-in from a user database into one central database, all
// with the same admin credentials, make one POST /_session for the jobs
// (the doc processor's and the _db_updates feed's own sessions aside,
// counted apart) and read the central database's info at most once per
// second of the burst (concurrent starts wait for the one read in flight).
func TestStartBurstSharesLoginAndInfo(t *testing.T) {
	skipShort(t)
	t.Setenv("COUCHREP_COUNT_REQUESTS_LOG", "1")
	const n = 60
	p := newPerUserServer(t, n)
	p.srv.AddAdmin(t, "adm", "adm-pw")
	watch := withCreds(strings.TrimSuffix(p.srv.URL, "/"), "adm", "adm-pw")
	p.node, p.addr = scaleNode(t, n, "COUCHREP_COUCHREP_WATCH="+watch, "COUCHREP_REPLICATOR_IDLE_PARK_AFTER=2")
	// The node's own start (its doc processor's login and first reads)
	// before the burst.
	waitFor(t, time.Minute, "the node follows _replicator", func() error {
		if c := upCompeting(t, p.node); len(c) != 1 || c[0].Status == "not_checked" {
			return fmt.Errorf("competing_replicators %+v", c)
		}
		return nil
	})
	p.startRequestsLog(t)
	docs := make([]json.RawMessage, 0, n)
	central := withCreds(p.central, "adm", "adm-pw")
	for _, u := range p.users {
		docs = append(docs, json.RawMessage(fmt.Sprintf(`{"_id":"in-%s","source":%q,"target":%q,"continuous":true}`,
			u, withCreds(p.srv.DBURL(perUserDB(u)), "adm", "adm-pw"), central)))
	}
	p.srv.Do(t, http.MethodPost, p.srv.DBURL("_replicator")+"_bulk_docs", map[string]any{"docs": docs}, http.StatusCreated)
	p.written = time.Now()
	p.jobs = n
	took := p.waitParked(t, 2*time.Minute)
	log := p.startRequestsLog(t)
	sessions, centralInfos := 0, 0
	for _, l := range log {
		switch k := startReqKind(l); {
		case strings.HasPrefix(l, "POST /_session"):
			sessions++
		case k == "central GET db":
			centralInfos++
		}
	}
	secs := int(took/time.Second) + 1
	t.Logf("%d jobs parked %s after the _bulk_docs: %d POST /_session, %d GET of the central database's info (%d requests in all)",
		n, took.Round(time.Millisecond), sessions, centralInfos, len(log))
	if sessions != 1 || centralInfos < 1 || centralInfos > secs {
		t.Errorf("%d jobs with one admin's credentials: %d POST /_session (want 1), %d central GET db in %s (want 1 to %d); the requests:\n%s",
			n, sessions, centralInfos, took.Round(time.Millisecond), secs, strings.Join(log, "\n"))
	}
}
