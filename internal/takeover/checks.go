package takeover

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Statuses of Assess, as GET /_up and couchrepctl nodes show them.
const (
	StatusCompeting = "competing"
	StatusNone      = "none_found"
	StatusUnknown   = "unknown"
)

// Verdict is what the facts say about competing replicators, for the
// node's periodic check.
type Verdict struct {
	// Status is StatusCompeting, StatusNone or StatusUnknown.
	Status string
	// Reason says what was found (every status).
	Reason string
	// ServerWide: the server's own replicator is on ([replicator] max_jobs
	// > 0, or replication tasks run): every _replicator database of the
	// server competes, not only those of Jobs.
	ServerWide bool
	// Jobs are the competing databases: running or crashing documents in
	// the server's scheduler (0 for a database only another store marks).
	Jobs map[string]int
	// OtherStores are the other couchrep stores with a live marker, as
	// "<store id> (node <node>)".
	OtherStores []string
}

// Assess turns facts into the node's verdict: competing as soon as one
// fact says so; none_found only when every fact was read and says none;
// unknown otherwise, with what could not be read.
func Assess(f Facts, now time.Time) Verdict {
	var v Verdict
	var found, unknown []string
	addDB := func(db string, n int) {
		if v.Jobs == nil {
			v.Jobs = map[string]int{}
		}
		v.Jobs[db] += n
	}
	if f.Replicator.On() {
		v.ServerWide = true
		found = append(found, fmt.Sprintf("its own replicator is on: [replicator] max_jobs = %d (%s)", f.Replicator.MaxJobs, f.Replicator.Source))
	} else if !f.Replicator.Known {
		unknown = append(unknown, f.Replicator.Reason)
	}
	if f.Tasks.Replication > 0 {
		v.ServerWide = true
		found = append(found, fmt.Sprintf("GET %s lists %d replication task(s)", TasksPath, f.Tasks.Replication))
	} else if !f.Tasks.Known {
		unknown = append(unknown, f.Tasks.Reason)
	}
	if n := sum(f.Scheduler.Jobs); n > 0 {
		for db, k := range f.Scheduler.Jobs {
			addDB(db, k)
		}
		found = append(found, fmt.Sprintf("its scheduler runs jobs for %d document(s)", n))
	} else if !f.Scheduler.Known {
		unknown = append(unknown, f.Scheduler.Reason)
	}
	seen := map[string]bool{}
	for _, m := range f.Markers.Live() {
		addDB(m.DB, 0)
		who := storeName(m)
		if !seen[who] {
			seen[who] = true
			v.OtherStores = append(v.OtherStores, who)
			found = append(found, fmt.Sprintf("another couchrep store follows %s: %s, marker refreshed %s ago", m.DB, who, age(now, m.Updated)))
		}
	}
	if !f.Markers.Known {
		unknown = append(unknown, f.Markers.Reason)
	}
	switch {
	case len(found) > 0:
		v.Status, v.Reason = StatusCompeting, strings.Join(found, "; ")
	case len(unknown) > 0:
		v.Status, v.Reason = StatusUnknown, strings.Join(unknown, "; ")
	default:
		v.Status = StatusNone
		v.Reason = fmt.Sprintf("[replicator] max_jobs = 0, no replication task, no running document, no other couchrep store's marker")
	}
	return v
}

func storeName(m Marker) string {
	if m.Node == "" {
		return "store " + m.Store
	}
	return fmt.Sprintf("store %s (node %s)", m.Store, m.Node)
}

func sum(m map[string]int) int {
	n := 0
	for _, k := range m {
		n += k
	}
	return n
}

func age(now, t time.Time) string {
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	return d.Round(time.Second).String()
}

// Results of a Check.
const (
	ResultOK      = "ok"
	ResultFail    = "fail"
	ResultUnknown = "unknown"
)

// Check is one precondition of a takeover: what was found and, unless it
// is met, the exact next step.
type Check struct {
	// Name is "watched", "uuid", "replicator", "tasks", "scheduler" or
	// "other_stores".
	Name string
	// Result is ResultOK, ResultFail or ResultUnknown (not met either).
	Result string
	Found  string
	Next   string
}

// Want is what the taking-over node brings to the checks.
type Want struct {
	// UUID is the server uuid the node uses (recorded in its job store).
	UUID string
	// Watched: the server is in the node's [couchrep] watch.
	Watched bool
	// Node names the node, for the next steps.
	Node string
}

// Checks evaluates the preconditions of taking over f's server. It is
// ready (Ready) only when every check is ResultOK.
func Checks(f Facts, w Want, now time.Time) []Check {
	srv := strings.TrimSuffix(f.Server, "/")
	var out []Check
	add := func(name, result, found, next string) {
		out = append(out, Check{Name: name, Result: result, Found: found, Next: next})
	}

	if w.Watched {
		add("watched", ResultOK, fmt.Sprintf("node %s watches %s ([couchrep] watch)", w.Node, f.Server), "")
	} else {
		add("watched", ResultFail, fmt.Sprintf("node %s does not watch %s", w.Node, f.Server),
			fmt.Sprintf("add the server, with admin credentials, to [couchrep] watch of the node's couchrep.ini (watch = %s with user:password) and restart couchrepd", f.Server))
	}

	switch {
	case f.UUID == "":
		add("uuid", ResultUnknown, f.UUIDReason, fmt.Sprintf("check that %s answers GET / (curl -u ADMIN %s/)", f.Server, srv))
	case f.UUID == w.UUID:
		add("uuid", ResultOK, fmt.Sprintf("the node uses the server's uuid %s (recorded in the job store): replication ids are the server's", f.UUID), "")
	default:
		add("uuid", ResultFail, fmt.Sprintf("the node uses uuid %s, the server's is %s: replication ids differ, no job would find the server's checkpoints", w.UUID, f.UUID),
			fmt.Sprintf("adopt the server's uuid: restart couchrepd once with --adopt-uuid %s (it lists the jobs that restart from zero), or set [couchdb] uuid = %s before the node's first start", f.Server, f.UUID))
	}

	maxJobs := fmt.Sprintf("set [replicator] max_jobs = 0 on %s: curl -u ADMIN -X PUT %s%s/max_jobs -d '\"0\"' (note the old value it answers, the one to go back to; in a cluster, on every node of GET /_membership)", f.Server, srv, NodeConfigPath)
	oldMaxJobs := fmt.Sprintf("set [replicator] max_jobs = 0 on %s where it keeps its configuration: curl -u ADMIN -X PUT %s%s/max_jobs -d '\"0\"'", f.Server, srv, OldConfigPath)
	switch r := f.Replicator; {
	case r.On() && strings.HasPrefix(r.Source, OldConfigPath):
		add("replicator", ResultFail, fmt.Sprintf("[replicator] max_jobs = %d (%s): the server's own replicator may run the _replicator documents", r.MaxJobs, r.Source), oldMaxJobs)
	case r.On():
		add("replicator", ResultFail, fmt.Sprintf("[replicator] max_jobs = %d (%s): the server's own replicator runs the _replicator documents", r.MaxJobs, r.Source), maxJobs)
	case r.Known:
		add("replicator", ResultOK, fmt.Sprintf("[replicator] max_jobs = %d (%s): the server's own replicator runs no job", r.MaxJobs, r.Source), "")
	default:
		next := maxJobs
		if strings.Contains(r.Reason, OldConfigPath) {
			next = oldMaxJobs
		}
		add("replicator", ResultUnknown, r.Reason, next)
	}

	wait := fmt.Sprintf("wait until CouchDB has stopped its jobs (at its next rescheduling, [replicator] interval, 60 s by default, after max_jobs = 0), then run couchrepctl takeover %s again", f.Server)
	switch t := f.Tasks; {
	case t.Replication > 0:
		add("tasks", ResultFail, fmt.Sprintf("GET %s lists %d replication task(s)", TasksPath, t.Replication), wait)
	case t.Known:
		add("tasks", ResultOK, fmt.Sprintf("GET %s lists no replication task", TasksPath), "")
	default:
		add("tasks", ResultUnknown, t.Reason, fmt.Sprintf("watch %s with server-admin credentials", f.Server))
	}

	switch s := f.Scheduler; {
	case sum(s.Jobs) > 0:
		dbs := slices.Sorted(maps.Keys(s.Jobs))
		add("scheduler", ResultFail, fmt.Sprintf("GET %s lists %d document(s) of %s", SchedulerPath, sum(s.Jobs), strings.Join(dbs, ", ")), wait)
	case s.Known && s.Present:
		add("scheduler", ResultOK, fmt.Sprintf("GET %s lists no document", SchedulerPath), "")
	case s.Known:
		add("scheduler", ResultOK, s.Reason, "")
	default:
		add("scheduler", ResultUnknown, s.Reason, fmt.Sprintf("watch %s with server-admin credentials", f.Server))
	}

	live := f.Markers.Live()
	var stale []string
	for _, m := range f.Markers.Others {
		if !m.Live {
			stale = append(stale, fmt.Sprintf("%s in %s, last refreshed %s ago", storeName(m), m.DB, age(now, m.Updated)))
		}
	}
	switch {
	case len(live) > 0:
		var who []string
		for _, m := range live {
			who = append(who, fmt.Sprintf("%s in %s, refreshed %s ago", storeName(m), m.DB, age(now, m.Updated)))
		}
		add("other_stores", ResultFail, "another couchrep store follows the _replicator databases: "+strings.Join(who, "; "),
			fmt.Sprintf("stop that store's nodes or remove %s from their [couchrep] watch (its entry in %s is stale %s after its last refresh), then run couchrepctl takeover %s again", f.Server, MarkerDocID, StaleAfter(live[0].Every), f.Server))
	case !f.Markers.Known:
		add("other_stores", ResultUnknown, f.Markers.Reason, fmt.Sprintf("watch %s with server-admin credentials", f.Server))
	default:
		found := fmt.Sprintf("no other couchrep store's marker (%s) in %s", MarkerDocID, dbList(f.Markers.Databases))
		if len(stale) > 0 {
			found += "; stale entries of stores that stopped: " + strings.Join(stale, "; ")
		}
		add("other_stores", ResultOK, found, "")
	}
	return out
}

func dbList(dbs []string) string {
	if len(dbs) == 0 {
		return "no _replicator database"
	}
	return strings.Join(dbs, ", ")
}

// Ready reports whether every check is met.
func Ready(checks []Check) bool {
	for _, c := range checks {
		if c.Result != ResultOK {
			return false
		}
	}
	return true
}
