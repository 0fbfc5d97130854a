package main

import (
	"bytes"
	"context"
	"flag"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/messages"
)

func ctl(args ...string) (string, string, int) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestUsageExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string // in stdout (exit 0) or stderr
	}{
		{nil, exitUsage, "Usage: couchrepctl"},
		{[]string{"--help"}, exitOK, "Exit codes: 0 ok, 1 error, 2 usage"},
		{[]string{"help"}, exitOK, "job restart ID"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"job"}, exitUsage, "needs a subcommand"},
		{[]string{"job", "--help"}, exitOK, "job cancel ID"},
		{[]string{"job", "frob"}, exitUsage, `not "frob"`},
		{[]string{"job", "show"}, exitUsage, "one job id"},
		{[]string{"job", "show", "--help"}, exitOK, "Usage: couchrepctl [flags] job show ID"},
		{[]string{"jobs", "--state", "asleep"}, exitUsage, "unknown state"},
		{[]string{"jobs", "--watch", "--interval", "0s"}, exitUsage, "--interval"},
		{[]string{"jobs", "--nope"}, exitUsage, "flag provided but not defined"},
		{[]string{"shares", "set", "a"}, exitUsage, "KEY=SHARES"},
		{[]string{"shares", "set", "a=1001"}, exitUsage, "KEY=SHARES"},
		{[]string{"config", "set", "max_jobs=x"}, exitUsage, "positive integer"},
		{[]string{"config", "set", "speed=1"}, exitUsage, "unknown key"},
		{[]string{"kill"}, exitUsage, "actor name"},
		{[]string{"send", "scheduler", "couchrep.v1.NoSuch", `{"a":1}`}, exitUsage, "only an empty body"},
		{[]string{"send", "scheduler", "couchrep.v1.TreeRequest", `{"bogus":1}`}, exitUsage, "JSON body"},
		{[]string{"--node", "127.0.0.1:1", "--timeout", "5s", "tree"}, exitError, "not reachable"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errOut, code := ctl(tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.out) {
				t.Fatalf("exit %d (want %d), output lacks %q:\nstdout %s\nstderr %s", code, tc.code, tc.out, out, errOut)
			}
		})
	}
}

func TestInterleave(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"ID --json", "--json ID"},
		{"ID --node x:1 --json", "--node x:1 --json ID"},
		{"--timeout=5s ID", "--timeout=5s ID"},
		{"ID -- --json", "ID --json"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		(&globals{}).register(fs)
		if got := strings.Join(interleave(fs, strings.Fields(tc.in)), " "); got != tc.want {
			t.Errorf("interleave(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestAgainstNode runs commands against an in-process node's admin handler,
// in both output modes.
func TestAgainstNode(t *testing.T) {
	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.DataDir = t.TempDir()
	cfg.Couchrep.HTTPBind = "127.0.0.1:0"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, err := couchrep.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Stop(ctx)
	mux := http.NewServeMux()
	mux.Handle(node.AdminHandler("tok"))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	g := []string{"--node", srv.URL, "--token", "tok"}

	out, errOut, code := ctl(append(g, "replicate", "--continuous", "http://127.0.0.1:1/a", "http://127.0.0.1:1/b")...)
	if code != exitOK || !strings.HasPrefix(out, "added job ") {
		t.Fatalf("replicate: %d %s %s", code, out, errOut)
	}
	id := strings.TrimSpace(strings.TrimPrefix(out, "added job "))
	out, _, code = ctl(append(g, "jobs")...)
	if code != exitOK || !strings.Contains(out, id) || !strings.Contains(out, "1 of 1 job(s)") {
		t.Fatalf("jobs: %d\n%s", code, out)
	}
	out, _, code = ctl(append(g, "jobs", "--json")...)
	var list messages.ListJobsResponse
	if err := protojson.Unmarshal([]byte(out), &list); code != exitOK || err != nil || list.GetJobs()[0].GetId() != id {
		t.Fatalf("jobs --json: %d %v\n%s", code, err, out)
	}
	out, _, code = ctl(append(g, "job", "show", id, "--json")...)
	var show messages.GetJobResponse
	if err := protojson.Unmarshal([]byte(out), &show); code != exitOK || err != nil || show.GetJob().GetSource() != "http://127.0.0.1:1/a/" {
		t.Fatalf("job show --json: %d %v\n%s", code, err, out)
	}
	out, _, code = ctl(append(g, "send", "scheduler", "couchrep.v1.SchedulerStatusRequest")...)
	if code != exitOK || !strings.Contains(out, "couchrep.v1.SchedulerStatusResponse") || !strings.Contains(out, `"max_jobs"`) {
		t.Fatalf("send: %d\n%s", code, out)
	}
	if _, errOut, code = ctl("--node", srv.URL, "tree"); code != exitError || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("tree without the token: %d %s", code, errOut)
	}
	if out, _, code = ctl(append(g, "job", "cancel", id)...); code != exitOK || !strings.Contains(out, "canceled job "+id) {
		t.Fatalf("job cancel: %d %s", code, out)
	}
	if _, errOut, code = ctl(append(g, "job", "show", id)...); code != exitError || !strings.Contains(errOut, "not_found") {
		t.Fatalf("job show after cancel: %d %s", code, errOut)
	}
}
