package main

// The commands about nodes: drain, undrain, stop, nodes.

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/couchrep/couchrep/messages"
)

func runDrain(ctx context.Context, e *env, _ []string) error {
	return request(ctx, e, e.client.Drain, &messages.DrainRequest{}, func(w io.Writer, r *messages.DrainResponse) error {
		fmt.Fprintf(w, "drained: accepting no jobs; %d job(s) handed back to the queue\n", r.GetReleased())
		for _, id := range r.GetJobIds() {
			fmt.Fprintf(w, "  %s\n", id)
		}
		return nil
	})
}

func runUndrain(ctx context.Context, e *env, _ []string) error {
	return request(ctx, e, e.client.Undrain, &messages.UndrainRequest{}, func(w io.Writer, _ *messages.UndrainResponse) error {
		_, err := fmt.Fprintln(w, "undrained: accepting jobs")
		return err
	})
}

func runStop(ctx context.Context, e *env, _ []string) error {
	return request(ctx, e, e.client.StopNode, &messages.StopNodeRequest{}, func(w io.Writer, r *messages.StopNodeResponse) error {
		_, err := fmt.Fprintf(w, "node %s stopping\n", r.GetNode())
		return err
	})
}

func runNodes(ctx context.Context, e *env, _ []string) error {
	return request(ctx, e, e.client.Nodes, &messages.NodesRequest{}, func(w io.Writer, r *messages.NodesResponse) error {
		return printNodes(w, r, time.Now())
	})
}

// printNodes prints the node table, the cluster's stability and the
// competing-replicator checks.
func printNodes(w io.Writer, r *messages.NodesResponse, now time.Time) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "NODE\tTYPES\tALIVE\tDRAINING\tJOBS\tHEARTBEAT\tADMIN\tHTTP")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, n := range r.GetNodes() {
		hb := "-"
		if n.GetLastHeartbeat() != nil {
			hb = age(now, n.GetLastHeartbeat(), true) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%v\t%d\t%s\t%s\t%s\n", n.GetName(), dash(strings.Join(n.GetTypes(), ",")), n.GetAlive(),
			n.GetDraining(), n.GetRunningJobs(), hb, dash(n.GetAdminAddress()), dash(n.GetHttpAddress()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.GetUnstable() {
		fmt.Fprintln(w, "membership changed recently: cluster unstable")
	}
	for _, c := range r.GetCompetingReplicators() {
		fmt.Fprintln(w, competingLine(c, now))
	}
	return nil
}

// competingNext is the next step for a competing replicator: turn
// CouchDB's replicator off, wait for it to stop its jobs, or stop the
// other couchrep store.
func competingNext(c *messages.CompetingReplicatorCheck) string {
	root := strings.TrimSuffix(c.GetServer(), "/")
	switch {
	case c.GetServerWide():
		return fmt.Sprintf(`stop it: curl -u ADMIN -X PUT %s/_node/_local/_config/replicator/max_jobs -d '"0"' `+
			"(on every node of a cluster; couchrepctl takeover %s checks every precondition)", root, c.GetServer())
	case len(c.GetOtherStores()) > 0:
		return "stop the other store's nodes, or remove " + c.GetServer() + " from their [couchrep] watch"
	default:
		return "wait until the server's replicator has stopped its jobs (its next rescheduling); couchrepctl takeover " + c.GetServer() + " checks every precondition"
	}
}

// competingLine is one watched server's competing-replicator check, as
// couchrepctl nodes prints it.
func competingLine(c *messages.CompetingReplicatorCheck, now time.Time) string {
	switch c.GetStatus() {
	case "competing":
		var dbs []string
		for _, d := range c.GetDatabases() {
			dbs = append(dbs, fmt.Sprintf("%s (%d running job(s), for %s)", d.GetDb(), d.GetJobs(), age(now, d.GetSince(), true)))
		}
		what := "warning only (on_competing_replicator = warn): both copy the same writes"
		if c.GetAction() == "refuse" {
			what = "couchrep runs no job of its _replicator documents while it runs"
			if n := c.GetStoppedJobs(); n > 0 {
				what = fmt.Sprintf("couchrep stopped %d job(s) of its _replicator documents and starts none while it runs", n)
			}
			what += " (on_competing_replicator = refuse); they resume from their checkpoints once it stops"
		}
		line := fmt.Sprintf("competing replicator on %s: %s", c.GetServer(), c.GetReason())
		if len(dbs) > 0 {
			line += "; databases: " + strings.Join(dbs, ", ")
		}
		return line + "; " + what + "\n  next: " + competingNext(c)
	case "none_found":
		if c.GetReason() != "" {
			return fmt.Sprintf("competing replicator on %s: none found (%s)", c.GetServer(), c.GetReason())
		}
		return fmt.Sprintf("competing replicator on %s: none found", c.GetServer())
	case "unknown":
		return fmt.Sprintf("competing replicator on %s: unknown: %s", c.GetServer(), c.GetReason())
	default:
		return fmt.Sprintf("competing replicator on %s: not checked yet", c.GetServer())
	}
}
