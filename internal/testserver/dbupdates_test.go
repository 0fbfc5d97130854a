package testserver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

// dbUpdate is one row of /_db_updates.
type dbUpdate struct {
	DBName string `json:"db_name"`
	Type   string `json:"type"`
	Seq    string `json:"seq"`
}

func (u dbUpdate) pair() string { return u.Type + ":" + u.DBName }

// feedDeadline bounds every wait on the feed; the waits end as soon as
// their condition holds.
const feedDeadline = 30 * time.Second

// dbuClient sends the test's requests: as the server's admin unless told.
type dbuClient struct {
	s      *Server
	client *http.Client
}

func newDBUClient(t *testing.T, s *Server) *dbuClient {
	c := &dbuClient{s: s, client: &http.Client{}}
	t.Cleanup(c.client.CloseIdleConnections)
	return c
}

func (c *dbuClient) admin() (string, string) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.adminUser, c.s.adminPass
}

// url is the server's URL for pathQuery without credentials (an external
// server's URL carries the admin's).
func (c *dbuClient) url(pathQuery string) string {
	u, err := url.Parse(c.s.URL + pathQuery)
	if err != nil {
		panic(err)
	}
	u.User = nil
	return u.String()
}

// do sends method path?query with Basic credentials user:pass (none when
// user is ""), and returns the status, headers and whole body.
func (c *dbuClient) do(method, pathQuery, user, pass string) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), feedDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.url(pathQuery), nil)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Accept", "application/json")
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// request is do failing the test on a transport error.
func (c *dbuClient) request(t *testing.T, method, pathQuery, user, pass string) (int, http.Header, []byte) {
	t.Helper()
	status, h, b, err := c.do(method, pathQuery, user, pass)
	if err != nil {
		t.Fatalf("%s /%s: %v", method, pathQuery, err)
	}
	return status, h, b
}

// updates reads a normal or longpoll feed as the admin.
func (c *dbuClient) updates(t *testing.T, query string) ([]dbUpdate, string) {
	t.Helper()
	user, pass := c.admin()
	status, h, b := c.request(t, http.MethodGet, "_db_updates?"+query, user, pass)
	if status != http.StatusOK {
		t.Fatalf("GET /_db_updates?%s: %d %s", query, status, b)
	}
	if ct := h.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("GET /_db_updates?%s: Content-Type %q", query, ct)
	}
	var out struct {
		Results []dbUpdate `json:"results"`
		LastSeq *string    `json:"last_seq"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("GET /_db_updates?%s: %q: %v", query, b, err)
	}
	if out.Results == nil || out.LastSeq == nil || *out.LastSeq == "" {
		t.Fatalf("GET /_db_updates?%s: no results or no string last_seq: %s", query, b)
	}
	for _, r := range out.Results {
		if r.DBName == "" || r.Seq == "" || (r.Type != "created" && r.Type != "updated" && r.Type != "deleted") {
			t.Fatalf("GET /_db_updates?%s: malformed row %+v in %s", query, r, b)
		}
	}
	return out.Results, *out.LastSeq
}

// now returns the feed's current seq (since=now).
func (c *dbuClient) now(t *testing.T) string {
	t.Helper()
	rows, last := c.updates(t, "since=now")
	if len(rows) != 0 {
		t.Fatalf("since=now gave rows %v", rows)
	}
	return last
}

// waitFor reads longpoll feeds from since until every pair ("type:db") in
// want has been seen, and returns the rows of dbs (all rows when dbs is
// empty) in the order the feeds gave them.
func (c *dbuClient) waitFor(t *testing.T, since string, dbs []string, want ...string) []dbUpdate {
	t.Helper()
	deadline := time.Now().Add(feedDeadline)
	var got []dbUpdate
	seen := map[string]bool{}
	for {
		missing := 0
		for _, w := range want {
			if !seen[w] {
				missing++
			}
		}
		if missing == 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: rows %v, still waiting for %v", feedDeadline, got, want)
		}
		rows, last := c.updates(t, "feed=longpoll&timeout=10000&since="+url.QueryEscape(since))
		for _, r := range rows {
			if len(dbs) == 0 || slices.Contains(dbs, r.DBName) {
				got = append(got, r)
				seen[r.pair()] = true
			}
		}
		since = last
	}
}

func pairs(rows []dbUpdate) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.pair()
	}
	return out
}

func only(rows []dbUpdate, dbs ...string) []dbUpdate {
	var out []dbUpdate
	for _, r := range rows {
		if slices.Contains(dbs, r.DBName) {
			out = append(out, r)
		}
	}
	return out
}

// sameSet reports whether got and want hold the same pairs, each once.
func sameSet(got, want []string) bool {
	g, w := slices.Clone(got), slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	return slices.Equal(g, w)
}

// checkRows compares the rows of a feed with want: in order on the
// PouchDB Server this package starts, as a set on an external CouchDB
// (whose _global_changes is sharded: rows of different shards interleave).
func checkRows(t *testing.T, s *Server, what string, got []dbUpdate, want ...string) {
	t.Helper()
	p := pairs(got)
	if s.External() {
		if !sameSet(p, want) {
			t.Fatalf("%s: rows %v, want %v (any order)", what, p, want)
		}
		return
	}
	if !slices.Equal(p, want) {
		t.Fatalf("%s: rows %v, want %v", what, p, want)
	}
	seqs := map[string]bool{}
	for _, r := range got {
		if seqs[r.Seq] {
			t.Fatalf("%s: seq %q given twice: %v", what, r.Seq, got)
		}
		seqs[r.Seq] = true
	}
}

// dbName is the name the server knows database short by (an external
// server's names carry the test's prefix).
func dbName(s *Server, short string) string {
	u := strings.TrimSuffix(strings.TrimPrefix(s.DBURL(short), s.URL), "/")
	n, err := url.PathUnescape(u)
	if err != nil {
		panic(err)
	}
	return n
}

// stream is a continuous, longpoll or eventsource feed read line by line.
// The request is sent from a goroutine: CouchDB sends a feed's headers
// only with its first row or heartbeat.
type stream struct {
	lines chan string
	hdr   chan http.Header // the answer's headers, once
	err   error            // why the feed ended early (read after lines closed)
}

func (c *dbuClient) open(t *testing.T, query string) *stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*feedDeadline)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("_db_updates?"+query), nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if user, pass := c.admin(); user != "" {
		req.SetBasicAuth(user, pass)
	}
	st := &stream{lines: make(chan string, 1024), hdr: make(chan http.Header, 1)}
	go func() {
		defer close(st.lines)
		resp, err := c.client.Do(req)
		if err != nil {
			st.err = err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			st.err = fmt.Errorf("GET /_db_updates?%s: %d %s", query, resp.StatusCode, b)
			return
		}
		st.hdr <- resp.Header
		r := bufio.NewReader(resp.Body)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				st.lines <- strings.TrimSuffix(line, "\n")
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		for range st.lines { // the reader has ended
		}
	})
	return st
}

// header waits for the answer's headers.
func (st *stream) header(t *testing.T) http.Header {
	t.Helper()
	select {
	case h := <-st.hdr:
		st.hdr <- h
		return h
	case <-time.After(feedDeadline):
		t.Fatalf("no answer in %s", feedDeadline)
		return nil
	}
}

// next returns the stream's next line; ok is false when the stream ended.
func (st *stream) next(t *testing.T) (line string, ok bool) {
	t.Helper()
	select {
	case line, ok = <-st.lines:
		if !ok && st.err != nil {
			t.Fatal(st.err)
		}
		return line, ok
	case <-time.After(feedDeadline):
		t.Fatalf("no line from the feed in %s", feedDeadline)
		return "", false
	}
}

// rowsUntil reads continuous rows until every pair in want was seen among
// dbs' rows, skipping blank lines (heartbeats).
func (st *stream) rowsUntil(t *testing.T, dbs []string, want ...string) (rows []dbUpdate) {
	t.Helper()
	seen := map[string]bool{}
	for {
		done := true
		for _, w := range want {
			done = done && seen[w]
		}
		if done {
			return rows
		}
		line, ok := st.next(t)
		if !ok {
			t.Fatalf("feed ended; rows %v, waiting for %v", rows, want)
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		var r dbUpdate
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Seq == "" {
			t.Fatalf("continuous line %q: not a row (%v); rows %v, waiting for %v", line, err, rows, want)
		}
		if slices.Contains(dbs, r.DBName) {
			rows = append(rows, r)
			seen[r.pair()] = true
		}
	}
}

// write stores a document (a new one, or a new revision of it).
func write(t *testing.T, s *Server, db, id string, body map[string]any) string {
	t.Helper()
	path := url.PathEscape(id)
	if local, ok := strings.CutPrefix(id, "_local/"); ok {
		path = "_local/" + url.PathEscape(local)
	}
	out := s.Do(t, http.MethodPut, s.DBURL(db)+path, body, http.StatusCreated)
	var r struct{ Rev string }
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	return r.Rev
}

func deleteDB(t *testing.T, s *Server, db string) {
	t.Helper()
	s.Do(t, http.MethodDelete, s.DBURL(db), nil, http.StatusOK)
}

func TestDBUpdatesFeeds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server")
	}
	s := StartPouchDBWithDBUpdates(t)
	c := newDBUClient(t, s)
	a, b, ghost, marker := dbName(s, "dbu-a"), dbName(s, "dbu-b"), dbName(s, "dbu-ghost"), dbName(s, "dbu-marker")

	t.Run("normal", func(t *testing.T) {
		l0 := c.now(t)
		s.CreateDB(t, "dbu-a")
		rev := write(t, s, "dbu-a", "d1", map[string]any{"v": 1})
		write(t, s, "dbu-a", "d1", map[string]any{"_rev": rev, "v": 2})
		write(t, s, "dbu-a", "d2", map[string]any{"v": 1})
		// _local documents are no update, as in CouchDB.
		write(t, s, "dbu-a", "_local/x", map[string]any{"v": 1})
		s.CreateDB(t, "dbu-b")
		deleteDB(t, s, "dbu-b")
		// A database that does not exist: pouchdb-server opens it to
		// destroy it (and answers 200), CouchDB answers 404; no rows either way.
		user, pass := c.admin()
		if status, _, body := c.request(t, http.MethodDelete, url.PathEscape(ghost), user, pass); status != http.StatusOK && status != http.StatusNotFound {
			t.Fatalf("DELETE /%s: %d %s", ghost, status, body)
		}
		s.CreateDB(t, "dbu-marker")
		c.waitFor(t, l0, []string{marker}, "created:"+marker)

		rows, last := c.updates(t, "since="+url.QueryEscape(l0))
		// Three writes to a make one row: the feed has one row per
		// (type, db), at its latest seq.
		checkRows(t, s, "since the start", only(rows, a, b, ghost, marker),
			"created:"+a, "updated:"+a, "created:"+b, "deleted:"+b, "created:"+marker)
		if !s.External() {
			if last != rows[len(rows)-1].Seq {
				t.Fatalf("last_seq %q, want the last row's seq %q", last, rows[len(rows)-1].Seq)
			}
			all, _ := c.updates(t, "since=0")
			for _, r := range all {
				if strings.HasPrefix(r.DBName, "pouch__") || strings.Contains(r.DBName, "-mrview-") {
					t.Fatalf("an internal database in the feed: %+v", r)
				}
			}
		}

		// limit
		one, oneLast := c.updates(t, "limit=1&since="+url.QueryEscape(l0))
		if len(one) != 1 || oneLast != one[0].Seq {
			t.Fatalf("limit=1: rows %v last_seq %q, want one row and its seq", one, oneLast)
		}
	})

	t.Run("since resumes", func(t *testing.T) {
		l1 := c.now(t)
		write(t, s, "dbu-a", "d3", map[string]any{"v": 1})
		got := c.waitFor(t, l1, []string{a}, "updated:"+a)
		checkRows(t, s, "after a write", got, "updated:"+a)
		rows, _ := c.updates(t, "since="+url.QueryEscape(got[0].Seq))
		if len(only(rows, a)) != 0 {
			t.Fatalf("since the row's own seq %q: rows %v, want none of %s", got[0].Seq, rows, a)
		}

		// Deleted and created again: both rows, in that order; since=0
		// lists each (type, db) once.
		l2 := c.now(t)
		deleteDB(t, s, "dbu-a")
		s.CreateDB(t, "dbu-a")
		got = c.waitFor(t, l2, []string{a}, "deleted:"+a, "created:"+a)
		checkRows(t, s, "delete and create", got, "deleted:"+a, "created:"+a)
		rows, _ = c.updates(t, "since="+url.QueryEscape(l2))
		checkRows(t, s, "delete and create, read again", only(rows, a), "deleted:"+a, "created:"+a)
		all, _ := c.updates(t, "since=0")
		checkRows(t, s, "since=0", only(all, a), "updated:"+a, "deleted:"+a, "created:"+a)
	})

	t.Run("longpoll", func(t *testing.T) {
		l := c.now(t)
		type answer struct {
			rows []dbUpdate
			last string
		}
		done := make(chan answer, 1)
		go func() {
			// No Fatal off the test goroutine: a failure comes back as
			// an empty last_seq.
			user, pass := c.admin()
			status, _, body, err := c.do(http.MethodGet, "_db_updates?feed=longpoll&since="+url.QueryEscape(l), user, pass)
			var out struct {
				Results []dbUpdate `json:"results"`
				LastSeq string     `json:"last_seq"`
			}
			if err != nil || status != http.StatusOK || json.Unmarshal(body, &out) != nil {
				out.LastSeq = ""
				out.Results = []dbUpdate{{Type: "error", DBName: fmt.Sprintf("%d %s %v", status, body, err)}}
			}
			done <- answer{out.Results, out.LastSeq}
		}()
		cName := dbName(s, "dbu-c")
		s.CreateDB(t, "dbu-c")
		var ans answer
		select {
		case ans = <-done:
		case <-time.After(feedDeadline):
			t.Fatalf("longpoll did not answer within %s of a database's creation", feedDeadline)
		}
		if ans.last == "" {
			t.Fatalf("longpoll answered %v", ans.rows)
		}
		// CouchDB may have answered with another database's row first.
		if !s.External() || len(only(ans.rows, cName)) > 0 {
			checkRows(t, s, "longpoll", only(ans.rows, cName), "created:"+cName)
		}
		if !s.External() && (len(ans.rows) != 1 || ans.last != ans.rows[0].Seq) {
			t.Fatalf("longpoll: rows %v last_seq %q, want c's row and its seq", ans.rows, ans.last)
		}

		// Nothing happens: the feed ends after timeout with no rows and
		// the seq it started from.
		l = c.now(t)
		rows, last := c.updates(t, "feed=longpoll&timeout=100&since=now")
		if !s.External() && (len(rows) != 0 || last != l) {
			t.Fatalf("longpoll timeout: rows %v last_seq %q, want none and %q", rows, last, l)
		}
	})

	t.Run("continuous", func(t *testing.T) {
		l := c.now(t)
		st := c.open(t, "feed=continuous&since="+url.QueryEscape(l))
		e := dbName(s, "dbu-e")
		s.CreateDB(t, "dbu-e")
		write(t, s, "dbu-e", "d", map[string]any{"v": 1})
		deleteDB(t, s, "dbu-e")
		rows := st.rowsUntil(t, []string{e}, "created:"+e, "updated:"+e, "deleted:"+e)
		if ct := st.header(t).Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Fatalf("continuous: Content-Type %q", ct)
		}
		checkRows(t, s, "continuous", rows, "created:"+e, "updated:"+e, "deleted:"+e)

		// limit: two rows, then last_seq, then the end.
		st2 := c.open(t, "feed=continuous&limit=2&since="+url.QueryEscape(l))
		var lines []string
		for {
			line, ok := st2.next(t)
			if !ok {
				break
			}
			if strings.TrimSpace(line) != "" {
				lines = append(lines, line)
			}
		}
		if len(lines) != 3 {
			t.Fatalf("continuous limit=2: lines %q, want two rows and last_seq", lines)
		}
		var second dbUpdate
		var end struct {
			LastSeq string `json:"last_seq"`
		}
		if json.Unmarshal([]byte(lines[1]), &second) != nil || json.Unmarshal([]byte(lines[2]), &end) != nil || end.LastSeq == "" || end.LastSeq != second.Seq {
			t.Fatalf("continuous limit=2: lines %q, want last_seq = the second row's seq", lines)
		}

		// timeout without heartbeat: the feed ends by itself with last_seq.
		now := c.now(t)
		st3 := c.open(t, "feed=continuous&timeout=100&since=now")
		lines = nil
		for {
			line, ok := st3.next(t)
			if !ok {
				break
			}
			if strings.TrimSpace(line) != "" {
				lines = append(lines, line)
			}
		}
		if len(lines) == 0 || !strings.HasPrefix(lines[len(lines)-1], `{"last_seq":`) {
			t.Fatalf("continuous timeout=100: lines %q, want a last_seq line at the end", lines)
		}
		if !s.External() && lines[0] != `{"last_seq":`+mustJSON(now)+`}` {
			t.Fatalf("continuous timeout=100: %q, want only last_seq %q", lines, now)
		}
	})

	t.Run("heartbeat", func(t *testing.T) {
		// Continuous: blank lines while nothing happens, then rows.
		l := c.now(t)
		st := c.open(t, "feed=continuous&heartbeat=50&since="+url.QueryEscape(l))
		for blanks := 0; blanks < 3; {
			line, ok := st.next(t)
			if !ok {
				t.Fatal("continuous feed with heartbeat ended")
			}
			if strings.TrimSpace(line) != "" {
				if s.External() {
					continue // another database's row
				}
				t.Fatalf("continuous heartbeat: line %q before any change", line)
			}
			blanks++
		}
		f := dbName(s, "dbu-f")
		s.CreateDB(t, "dbu-f")
		rows := st.rowsUntil(t, []string{f}, "created:"+f)
		checkRows(t, s, "after heartbeats", rows, "created:"+f)

		// Longpoll: the heartbeats are newlines inside the JSON body.
		lp := c.open(t, "feed=longpoll&heartbeat=50&since=now")
		if line, _ := lp.next(t); line != `{"results":[` {
			t.Fatalf("longpoll heartbeat: first line %q", line)
		}
		for blanks := 0; blanks < 3; blanks++ {
			if line, ok := lp.next(t); !ok || line != "" {
				t.Fatalf("longpoll heartbeat: line %q (open %v), want a blank line", line, ok)
			}
		}

		// Eventsource: rows as events with an id, heartbeats as events.
		if s.External() {
			// CouchDB 3.4.3's eventsource feed sends the _global_changes
			// rows untransformed ({"seq","id":"created:db","changes"})
			// and ends at its first heartbeat (integration/README.md).
			t.Log("eventsource: not checked on an external CouchDB")
			return
		}
		es := c.open(t, "feed=eventsource&heartbeat=50&since="+url.QueryEscape(l))
		var sawRow, sawHeartbeat bool
		var pending dbUpdate
		for !sawRow || !sawHeartbeat {
			line, ok := es.next(t)
			if !ok {
				t.Fatalf("eventsource feed ended (row seen: %v)", sawRow)
			}
			switch {
			case strings.HasPrefix(line, "data: {"):
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &pending); err != nil {
					t.Fatalf("eventsource: %q: %v", line, err)
				}
			case strings.HasPrefix(line, "id: "):
				if line != "id: "+mustJSON(pending.Seq) {
					t.Fatalf("eventsource: %q after the row %+v", line, pending)
				}
				if pending.pair() == "created:"+f {
					sawRow = true
				}
			case line == "event: heartbeat":
				sawHeartbeat = sawRow
			}
		}
		if ct := es.header(t).Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("eventsource: Content-Type %q", ct)
		}
	})

	t.Run("parameters", func(t *testing.T) {
		user, pass := c.admin()
		for _, tc := range []struct{ query, reason string }{
			{"since=garbage", "Malformed sequence supplied in 'since' parameter."},
			{"since=5", "Malformed sequence supplied in 'since' parameter."},
			{"feed=bogus", "Supported `feed` types: normal, continuous, longpoll, eventsource"},
			{"limit=x", "invalid_integer"},
			{"heartbeat=-1&feed=continuous", "invalid_integer"},
		} {
			status, _, body := c.request(t, http.MethodGet, "_db_updates?"+tc.query, user, pass)
			var e struct{ Error, Reason string }
			if status != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error != "bad_request" || e.Reason != tc.reason {
				t.Errorf("?%s: %d %s, want 400 bad_request %q", tc.query, status, body, tc.reason)
			}
		}
		status, h, body := c.request(t, http.MethodPost, "_db_updates", user, pass)
		if status != http.StatusMethodNotAllowed || h.Get("Allow") != "GET" || !strings.Contains(string(body), `"method_not_allowed"`) {
			t.Errorf("POST: %d Allow %q %s, want 405 method_not_allowed, Allow: GET", status, h.Get("Allow"), body)
		}
	})
}

func TestDBUpdatesAdminOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server")
	}
	s := StartPouchDBWithDBUpdates(t)
	c := newDBUClient(t, s)
	if !s.External() {
		// PouchDB Server without an admin is an "admin party": everyone is
		// an admin (CouchDB 3 has no such state).
		if status, _, body := c.request(t, http.MethodGet, "_db_updates", "", ""); status != http.StatusOK {
			t.Fatalf("no admin yet, anonymous: %d %s, want 200", status, body)
		}
		s.AddAdmin(t, "boss", "secret")
		user := map[string]any{"name": "joe", "password": "joepw", "roles": []string{}, "type": "user"}
		s.Do(t, http.MethodPut, s.URL+"_users/org.couchdb.user:joe", user, http.StatusCreated)
		checkRefused(t, c, "joe, not an admin", "joe", "joepw", "You are not a server admin.")
	}
	checkRefused(t, c, "anonymous", "", "", "You are not a server admin.")
	admin, pass := c.admin()
	checkRefused(t, c, "a wrong password", admin, pass+"-wrong", "Name or password is incorrect.")
	if status, _, body := c.request(t, http.MethodGet, "_db_updates?since=now", admin, pass); status != http.StatusOK {
		t.Fatalf("the admin: %d %s, want 200", status, body)
	}
	// The streaming feeds are refused before they start.
	checkRefused(t, c, "anonymous continuous", "", "", "You are not a server admin.", "feed=continuous")
}

func checkRefused(t *testing.T, c *dbuClient, who, user, pass, reason string, query ...string) {
	t.Helper()
	q := "_db_updates"
	if len(query) > 0 {
		q += "?" + query[0]
	}
	status, _, body := c.request(t, http.MethodGet, q, user, pass)
	var e struct{ Error, Reason string }
	if status != http.StatusUnauthorized || json.Unmarshal(body, &e) != nil || e.Error != "unauthorized" || e.Reason != reason {
		t.Fatalf("%s: %d %s, want 401 unauthorized %q", who, status, body, reason)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
