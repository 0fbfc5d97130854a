package main

// The commands about jobs: jobs (--watch), job show|stop|restart|cancel,
// replicate.

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

func setupJobs(fs *flag.FlagSet) runFunc {
	var (
		states, db, node string
		limit            uint
		watch            bool
		interval         time.Duration
		count            int
	)
	fs.StringVar(&states, "state", "", "only jobs in these `states` (comma-separated: pending,running,crashing,completed,failed)")
	fs.StringVar(&db, "db", "", "only the jobs of this _replicator `database`")
	fs.StringVar(&node, "node-name", "", "only the jobs run (or last run) by this `node`")
	fs.UintVar(&limit, "limit", 0, "show at most `n` jobs (0: all)")
	fs.BoolVar(&watch, "watch", false, "redraw the list every --interval with live progress (until interrupted)")
	fs.DurationVar(&interval, "interval", time.Second, "refresh `period` of --watch")
	fs.IntVar(&count, "count", 0, "with --watch: stop after `n` refreshes (0: never)")
	return func(ctx context.Context, e *env, _ []string) error {
		req := &messages.ListJobsRequest{Database: db, Node: node, Limit: uint32(limit)}
		for _, s := range strings.Split(states, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			st, err := admin.ParseStatus(strings.ToLower(s))
			if err != nil {
				return usagef("unknown state %q (pending, running, crashing, completed, failed)", s)
			}
			req.States = append(req.States, st)
		}
		if !watch {
			resp, err := ask(ctx, e, e.client.ListJobs, req)
			if err != nil {
				return err
			}
			if e.g.json {
				return printJSON(e.out, resp)
			}
			return printJobs(e.out, resp, nil, 0, time.Now())
		}
		if interval <= 0 {
			return usagef("--interval must be positive")
		}
		return watchJobs(ctx, e, req, interval, count)
	}
}

// watchJobs redraws the job list every interval: in place on a terminal,
// as successive tables otherwise, and as one JSON object per line with
// --json. It ends when ctx does (Ctrl-C), after count refreshes, or on an
// error.
func watchJobs(ctx context.Context, e *env, req *messages.ListJobsRequest, interval time.Duration, count int) error {
	var prev map[string]uint64
	var prevAt time.Time
	t := time.NewTicker(interval)
	defer t.Stop()
	for i := 0; count == 0 || i < count; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
		resp, err := ask(ctx, e, e.client.ListJobs, req)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		now := time.Now()
		if e.g.json {
			b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(resp)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.out, "%s\n", b)
			continue
		}
		var buf strings.Builder
		if e.terminal {
			buf.WriteString("\x1b[H\x1b[2J") // home, clear screen
		} else if i > 0 {
			buf.WriteString("\n")
		}
		fmt.Fprintf(&buf, "%s  every %s  (Ctrl-C to stop)\n", now.Format("15:04:05"), interval)
		if err := printJobs(&buf, resp, prev, now.Sub(prevAt), now); err != nil {
			return err
		}
		if _, err := io.WriteString(e.out, buf.String()); err != nil {
			return err
		}
		prev, prevAt = map[string]uint64{}, now
		for _, j := range resp.GetJobs() {
			prev[j.GetId()] = j.GetStats().GetDocsWritten()
		}
	}
	return nil
}

// startedFrom says where a job's run started: its own checkpoint,
// CouchDB's (couchdb_checkpoint), since_seq or zero, with the sequence's
// number (ShortSeq): "checkpoint@12345".
func startedFrom(st *messages.JobStats) string {
	if st.GetStartFrom() == "" {
		return "-"
	}
	if st.GetStartFrom() == "zero" {
		return "zero"
	}
	return st.GetStartFrom() + "@" + ShortSeq(st.GetStartSeq())
}

// maxSeqWidth bounds a sequence ShortSeq shows that has no number part.
const maxSeqWidth = 16

// ShortSeq is a sequence as a table shows it: its number part, as CouchDB
// operators read one ("12345-g1AAAA…" → "12345", "[12,\"g1…\"]" → "12"),
// anything else clipped to maxSeqWidth characters.
func ShortSeq(seq string) string {
	s := strings.TrimSpace(seq)
	var v any
	if json.Unmarshal([]byte(s), &v) == nil {
		switch x := v.(type) {
		case string:
			s = x
		case float64:
			return strings.TrimSpace(s)
		case []any:
			if len(x) > 0 {
				if n, ok := x[0].(float64); ok {
					return fmt.Sprint(int64(n))
				}
			}
		}
	}
	if num, _, ok := strings.Cut(s, "-"); ok && num != "" && strings.Trim(num, "0123456789") == "" {
		return num
	}
	if r := []rune(s); len(r) > maxSeqWidth {
		return string(r[:maxSeqWidth-1]) + "…"
	}
	return s
}

// printJobs prints the job table; with prev (docs written per job at the
// last refresh, elapsed ago) it adds each job's write rate.
func printJobs(w io.Writer, resp *messages.ListJobsResponse, prev map[string]uint64, elapsed time.Duration, now time.Time) error {
	tw := newTable(w)
	header := "ID\tSTATE\tNODE\tDOCS_WRITTEN\tPENDING\tERRORS\tSTARTED_FROM\tUPDATED\tSOURCE\tTARGET"
	if prev != nil {
		header = "ID\tSTATE\tNODE\tDOCS_WRITTEN\tDOCS/S\tPENDING\tERRORS\tSTARTED_FROM\tUPDATED\tSOURCE\tTARGET"
	}
	fmt.Fprintln(tw, header)
	parked := 0
	for _, j := range resp.GetJobs() {
		pending := "-"
		if p := j.GetStats().GetChangesPending(); p >= 0 {
			pending = fmt.Sprint(p)
		}
		node := j.GetNode()
		if node == "" {
			node = "-"
		}
		state := admin.StatusName(j.GetStatus())
		if j.GetParkedSince() != nil {
			state += "/PARKED" // running, its feed closed until its source changes
			parked++
		}
		if j.GetPausedAt() != nil {
			state += "/PAUSED" // pending, never started until resumed
		}
		cols := []string{j.GetId(), state, node, fmt.Sprint(j.GetStats().GetDocsWritten())}
		if prev != nil {
			rate := "-"
			if before, ok := prev[j.GetId()]; ok && elapsed > 0 && j.GetStats().GetDocsWritten() >= before {
				rate = fmt.Sprintf("%.1f", float64(j.GetStats().GetDocsWritten()-before)/elapsed.Seconds())
			}
			cols = append(cols, rate)
		}
		cols = append(cols, pending, fmt.Sprint(j.GetErrorCount()), startedFrom(j.GetStats()), age(now, j.GetLastUpdated(), j.GetLastUpdated() != nil),
			j.GetSource(), j.GetTarget())
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if parked > 0 {
		_, err := fmt.Fprintf(w, "%d of %d job(s), %d of them parked (running, feed closed until the source changes)\n", len(resp.GetJobs()), resp.GetTotal(), parked)
		return err
	}
	_, err := fmt.Fprintf(w, "%d of %d job(s)\n", len(resp.GetJobs()), resp.GetTotal())
	return err
}

func runJobShow(ctx context.Context, e *env, args []string) error {
	return jobRequest(ctx, e, "job show", args, e.client.GetJob, func(id string) *messages.GetJobRequest { return &messages.GetJobRequest{Id: id} },
		func(w io.Writer, r *messages.GetJobResponse) error { return printJob(w, r.GetJob()) })
}

func printJob(w io.Writer, j *messages.JobSummary) error {
	now := time.Now()
	tw := newTable(w)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("id", j.GetId())
	row("replication_id", j.GetReplicationId())
	row("state", admin.StatusName(j.GetStatus()))
	row("kind", j.GetKind())
	if j.GetDatabase() != "" {
		// A document's job id is "SERVER|DB|DOCID", the server's URL
		// without credentials.
		if server, _, ok := strings.Cut(j.GetId(), "|"); ok {
			row("server", server)
		}
		row("database", j.GetDatabase())
		row("doc_id", j.GetDocId())
	}
	row("source", j.GetSource())
	row("target", j.GetTarget())
	row("continuous", j.GetContinuous())
	if j.GetNode() != "" {
		row("node", j.GetNode())
		row("actor", admin.ActorName(j.GetId())+" (in couchrepctl tree)")
	}
	if j.GetStartTime() != nil {
		row("started", j.GetStartTime().AsTime().UTC().Format(time.RFC3339))
	}
	if pa := j.GetPausedAt(); pa != nil {
		row("paused", pa.AsTime().UTC().Format(time.RFC3339)+" ("+age(now, pa, true)+" ago: `couchrepctl job resume` runs it again)")
	}
	if ra := j.GetResetAt(); ra != nil {
		row("reset", ra.AsTime().UTC().Format(time.RFC3339)+" (its next run starts from sequence 0)")
	}
	if ps := j.GetParkedSince(); ps != nil {
		row("parked_since", ps.AsTime().UTC().Format(time.RFC3339)+" ("+age(now, ps, true)+" ago: idle, its feed closed until its source changes)")
	}
	if j.GetLastUpdated() != nil {
		row("updated", j.GetLastUpdated().AsTime().UTC().Format(time.RFC3339)+" ("+age(now, j.GetLastUpdated(), true)+" ago)")
	}
	if j.GetError() != "" {
		row("error", j.GetError())
	}
	row("error_count", j.GetErrorCount())
	st := j.GetStats()
	row("docs_read", st.GetDocsRead())
	row("docs_written", st.GetDocsWritten())
	row("doc_write_failures", st.GetDocWriteFailures())
	row("revisions_checked", st.GetRevisionsChecked())
	row("missing_revisions_found", st.GetMissingRevisionsFound())
	if st.GetChangesPending() >= 0 {
		row("changes_pending", st.GetChangesPending())
	} else {
		row("changes_pending", "-")
	}
	row("checkpointed_source_seq", st.GetCheckpointedSourceSeq())
	row("started_from", startedFrom(st))
	row("lag", lagText(j.GetLagSeconds()))
	if err := tw.Flush(); err != nil {
		return err
	}
	if fs := j.GetWriteFailures(); len(fs) > 0 {
		fmt.Fprintf(w, "\ndocuments the target refused (%d, newest last; the last %d are kept):\n", len(fs), repjob.MaxWriteFailures)
		tw = newTable(w)
		fmt.Fprintln(tw, "  TIME\tDOC_ID\tREV\tSTATUS\tERROR\tREASON")
		for _, f := range fs {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\n", f.GetAt().AsTime().UTC().Format(time.RFC3339), f.GetId(), f.GetRev(),
				f.GetStatus(), f.GetError(), f.GetReason())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(j.GetHistory()) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nhistory (newest first):\n")
	tw = newTable(w)
	fmt.Fprintln(tw, "  TIME\tEVENT\tREASON")
	for _, h := range j.GetHistory() {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", h.GetTimestamp().AsTime().UTC().Format(time.RFC3339), lower("JOB_EVENT_TYPE_", h.GetType()), h.GetReason())
	}
	return tw.Flush()
}

func runJobStop(ctx context.Context, e *env, args []string) error {
	return jobRequest(ctx, e, "job stop", args, e.client.StopJob, func(id string) *messages.StopJobRequest { return &messages.StopJobRequest{Id: id} },
		func(w io.Writer, r *messages.StopJobResponse) error { return printJobNow(w, "stopped", r.GetJob()) })
}

func runJobRestart(ctx context.Context, e *env, args []string) error {
	return jobRequest(ctx, e, "job restart", args, e.client.RestartJob, func(id string) *messages.RestartJobRequest { return &messages.RestartJobRequest{Id: id} },
		func(w io.Writer, r *messages.RestartJobResponse) error {
			j, again := awaitRestart(ctx, r.GetJob(), restartWait, func(ctx context.Context, id string) (*messages.JobSummary, error) {
				resp, err := ask(ctx, e, e.client.GetJob, &messages.GetJobRequest{Id: id})
				return resp.GetJob(), err
			})
			if again {
				_, err := fmt.Fprintf(w, "restarted job %s: it started and crashed again (%d in a row): %s\n", j.GetId(), j.GetErrorCount(), j.GetError())
				return err
			}
			return printJobNow(w, "restarted", j)
		})
}

// restartWait is how long `job restart` waits for a job it made due to
// start, so that it can say it runs (the scheduler starts due jobs at its
// next pass, a few seconds at most on a node with a free slot).
const restartWait = 10 * time.Second

// awaitRestart polls the job a restart made due (pending, or still shown
// crashing until it starts) until it runs, ends, or crashes again, for at
// most wait; it returns the job as last seen, and whether it crashed again.
func awaitRestart(ctx context.Context, j *messages.JobSummary, wait time.Duration, get func(ctx context.Context, id string) (*messages.JobSummary, error)) (*messages.JobSummary, bool) {
	st := admin.StatusName(j.GetStatus())
	if st != "pending" && st != "crashing" {
		return j, false
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return j, false
		case <-tick.C:
		}
		now, err := get(ctx, j.GetId())
		if err != nil || now == nil {
			continue
		}
		switch admin.StatusName(now.GetStatus()) {
		case "pending":
			j = now
		case "crashing":
			if now.GetErrorCount() > j.GetErrorCount() {
				return now, true
			}
			j = now
		default:
			return now, false
		}
	}
}

// printJobNow prints what was done to job j and what happened next: a
// stopped job goes back to the queue, and on a node with a free slot the
// scheduler may start it again at once (it stays due).
func printJobNow(w io.Writer, done string, j *messages.JobSummary) error {
	st := admin.StatusName(j.GetStatus())
	var msg string
	switch {
	case done == "stopped" && st == "running":
		msg = fmt.Sprintf("stopped job %s: it checkpointed and went back to the queue, and node %s started it again at once "+
			"(a stopped job stays due; delete its document, or `job cancel` a transient job, to end it)", j.GetId(), j.GetNode())
	case done == "stopped" && st == "pending":
		msg = fmt.Sprintf("stopped job %s: it checkpointed and is back in the queue (pending); a node with a free slot starts it again", j.GetId())
	case done == "restarted" && st == "running":
		msg = fmt.Sprintf("restarted job %s: running on node %s", j.GetId(), j.GetNode())
	case done == "resumed" && st == "running":
		msg = fmt.Sprintf("resumed job %s: running on node %s", j.GetId(), j.GetNode())
	case done == "resumed" && st == "pending":
		msg = fmt.Sprintf("resumed job %s: due now (pending); a node with a free slot starts it", j.GetId())
	case done == "restarted" && st == "pending":
		msg = fmt.Sprintf("restarted job %s: due now (pending); a node with a free slot starts it", j.GetId())
	case done == "restarted" && st == "crashing":
		msg = fmt.Sprintf("restarted job %s: due now, its backoff skipped (shown crashing with its last error until it starts); a node with a free slot starts it", j.GetId())
	default:
		msg = fmt.Sprintf("%s job %s: it is %s now", done, j.GetId(), st)
	}
	_, err := fmt.Fprintln(w, msg)
	return err
}

func runJobPause(ctx context.Context, e *env, args []string) error {
	return jobRequest(ctx, e, "job pause", args, e.client.PauseJob, func(id string) *messages.PauseJobRequest { return &messages.PauseJobRequest{Id: id} },
		func(w io.Writer, r *messages.PauseJobResponse) error {
			_, err := fmt.Fprintf(w, "paused job %s: it stays pending, never started, until `couchrepctl job resume %s`\n", r.GetJob().GetId(), r.GetJob().GetId())
			return err
		})
}

func runJobResume(ctx context.Context, e *env, args []string) error {
	return jobRequest(ctx, e, "job resume", args, e.client.ResumeJob, func(id string) *messages.ResumeJobRequest { return &messages.ResumeJobRequest{Id: id} },
		func(w io.Writer, r *messages.ResumeJobResponse) error { return printJobNow(w, "resumed", r.GetJob()) })
}

// stdin is where job reset reads its confirmation (tests replace it).
var stdin io.Reader = os.Stdin

func setupJobReset(fs *flag.FlagSet) runFunc {
	var yes bool
	fs.BoolVar(&yes, "yes", false, "do not ask for confirmation")
	return func(ctx context.Context, e *env, args []string) error {
		id, err := oneID("job reset", args)
		if err != nil {
			return err
		}
		if !yes {
			fmt.Fprintf(e.out, "Reset job %s: its next run reads the source again from sequence 0 (its checkpoint documents are kept). Continue? [y/N] ", id)
			line, _ := bufio.NewReader(stdin).ReadString('\n')
			if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
				return usagef("job reset: not confirmed (answer y, or pass --yes)")
			}
		}
		return request(ctx, e, e.client.ResetJob, &messages.ResetJobRequest{Id: id}, func(w io.Writer, r *messages.ResetJobResponse) error {
			j := r.GetJob()
			msg := fmt.Sprintf("reset job %s: its next run starts from sequence 0", j.GetId())
			if j.GetPausedAt() != nil {
				msg += " (it is paused: `couchrepctl job resume` runs it)"
			} else {
				msg += "; it is " + admin.StatusName(j.GetStatus()) + " now"
			}
			_, err := fmt.Fprintln(w, msg)
			return err
		})
	}
}

func runJobCancel(ctx context.Context, e *env, args []string) error {
	return jobRequest(ctx, e, "job cancel", args, e.client.CancelJob, func(id string) *messages.CancelJobRequest { return &messages.CancelJobRequest{Id: id} },
		func(w io.Writer, r *messages.CancelJobResponse) error {
			_, err := fmt.Fprintf(w, "canceled job %s\n", r.GetId())
			return err
		})
}

// jobRequest sends the request mk makes for the one job id (or
// replication id) args must hold.
func jobRequest[Req, Resp any](ctx context.Context, e *env, name string, args []string, method rpcMethod[Req, Resp],
	mk func(id string) *Req, text func(w io.Writer, reply *Resp) error) error {
	id, err := oneID(name, args)
	if err != nil {
		return err
	}
	return request(ctx, e, method, mk(id), text)
}

func setupReplicate(fs *flag.FlagSet) runFunc {
	var continuous, createTarget bool
	var user string
	fs.BoolVar(&continuous, "continuous", false, "keep replicating new changes")
	fs.BoolVar(&createTarget, "create-target", false, "create the target database if missing")
	fs.StringVar(&user, "user", "", "the `user` the job runs for (its fair-share key; default admin)")
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) != 2 {
			return usagef("replicate takes a source URL and a target URL")
		}
		body := map[string]any{"source": args[0], "target": args[1]}
		if continuous {
			body["continuous"] = true
		}
		if createTarget {
			body["create_target"] = true
		}
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		var resp messages.ReplicateResponse
		if err := send(ctx, e, "", &messages.ReplicateRequest{Body: string(b), User: user}, &resp); err != nil {
			return err
		}
		if e.g.json {
			return printJSON(e.out, &resp)
		}
		fmt.Fprintf(e.out, "added job %s\n", resp.GetId())
		return nil
	}
}

// lagText is a job's lag as job show prints it.
func lagText(secs float64) string {
	if secs <= 0 {
		return "0s (caught up, or no changes pending)"
	}
	return (time.Duration(secs) * time.Second).String() + " without progress while changes are pending"
}
