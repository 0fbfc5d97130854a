package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/actors/httpserver"
)

// TestStartupLogOffATerminal: with stderr not a terminal and the default
// format (auto), every line couchrepd logs from its first on is a JSON
// object without terminal escapes (protoactor's own logger wrote a
// coloured text line first), and the ready line gives the status page's
// URL at the address the HTTP API listens on. The process's own stderr
// is the file too, as under systemd or `2>file`: libraries that write to
// os.Stderr themselves are caught.
func TestStartupLogOffATerminal(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	stderrFile, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderrFile.Close()
	saved := os.Stderr
	os.Stderr = stderrFile
	defer func() { os.Stderr = saved }()
	logged := func() string {
		b, _ := os.ReadFile(stderrFile.Name())
		return string(b)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--data", data, "--http", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--log-level", "info"}, &stdout, stderrFile)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logged(), "couchrepd ready") {
		select {
		case code := <-done:
			t.Fatalf("couchrepd exited %d before it was ready:\n%s", code, logged())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("couchrepd not ready after 30s:\n%s", logged())
		}
		time.Sleep(20 * time.Millisecond) // polling the node's log
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("couchrepd exited %d:\n%s", code, logged())
	}
	addr, err := os.ReadFile(filepath.Join(data, httpserver.AddrFile))
	if err != nil {
		t.Fatal(err)
	}
	wantURL := "http://" + strings.TrimSpace(string(addr)) + "/_status"
	lines := strings.Split(strings.TrimRight(logged(), "\n"), "\n")
	sawReady := false
	for i, l := range lines {
		if strings.Contains(l, "\x1b[") {
			t.Errorf("line %d has terminal escapes: %q", i+1, l)
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Errorf("line %d is not a JSON object: %q", i+1, l)
			continue
		}
		if ev["message"] == "couchrepd ready" {
			sawReady = true
			if ev["status_page"] != wantURL {
				t.Errorf("ready line: status_page %v, want %s", ev["status_page"], wantURL)
			}
		}
	}
	if !sawReady {
		t.Errorf("no ready line in:\n%s", logged())
	}
}
