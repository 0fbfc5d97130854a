package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/testserver"
)

func TestReplicateUsageAndFailures(t *testing.T) {
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String() + "/db"
	l.Close()
	tests := []struct {
		name    string
		args    []string
		code    int
		stderrs string
	}{
		{"no args", nil, 2, "usage"},
		{"one arg", []string{"http://h/a"}, 2, "usage"},
		{"bad selector", []string{"--selector", "{nope", "http://h/a", "http://h/b"}, 2, "--selector"},
		{"local endpoint", []string{"a", "http://h/b"}, 2, "source"},
		{"exclusive filters", []string{"--doc-ids", "a,b", "--filter", "d/f", "http://h/a", "http://h/b"}, 2, "mutually exclusive"},
		{"unreachable source", []string{"--retries-per-request", "0", dead, dead}, 1, "db_not_found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := runReplicate(context.Background(), tc.args, &out, &errb, zerolog.Nop())
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, tc.code, errb.String())
			}
			if !strings.Contains(errb.String(), tc.stderrs) {
				t.Errorf("stderr %q lacks %q", errb.String(), tc.stderrs)
			}
			if out.Len() != 0 {
				t.Errorf("stdout not empty: %s", out.String())
			}
		})
	}
}

func TestReplicatePouchDB(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server")
	}
	s := testserver.StartPouchDB(t)
	src := s.CreateDB(t, "src")
	s.PutRevs(t, src, testserver.Doc("a", []string{"1-a"}, nil), testserver.Doc("b", []string{"2-b2", "1-b1"}, nil))
	tgt := s.DBURL("tgt")
	for i, want := range []string{`"docs_written":2`, `"no_changes":true`} {
		var out, errb bytes.Buffer
		code := runReplicate(context.Background(), []string{"--create-target", "--uuid", "u", "--worker-batch-size", "1", src, tgt}, &out, &errb, zerolog.Nop())
		if code != 0 {
			t.Fatalf("run %d: exit %d: %s", i, code, errb.String())
		}
		var body map[string]any
		if err := json.Unmarshal(out.Bytes(), &body); err != nil || body["ok"] != true {
			t.Fatalf("run %d: stdout %q", i, out.String())
		}
		if !strings.Contains(out.String(), want) {
			t.Errorf("run %d: stdout %s lacks %s", i, out.String(), want)
		}
	}
}
