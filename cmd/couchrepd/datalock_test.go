package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLockDataDir: the second lock on a data directory fails at once,
// naming the pid of the holder (written into the lock file); once the
// holder releases it, the directory can be locked again.
func TestLockDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // created by the lock
	l, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(os.Getpid())
	if b, err := os.ReadFile(filepath.Join(dir, LockFile)); err != nil || strings.TrimSpace(string(b)) != pid {
		t.Fatalf("lock file holds %q, %v; want pid %s", b, err, pid)
	}
	_, err = lockDataDir(dir)
	if !errors.Is(err, errDataDirInUse) {
		t.Fatalf("second lock: %v, want errDataDirInUse", err)
	}
	for _, want := range []string{"pid " + pid, dir, LockFile, "--data"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	l.release()
	l2, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	l2.release()
}

// TestVersionFlag: --version prints the build and exits 0 without
// reading any configuration or data directory.
func TestVersionFlag(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"--data", "/nonexistent/dir", "--version"}} {
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), args, &stdout, &stderr); code != 0 {
			t.Fatalf("couchrepd %v: exit %d, stderr %q", args, code, stderr.String())
		}
		if out := stdout.String(); !strings.HasPrefix(out, "couchrepd ") || !strings.Contains(out, "go1.") || strings.Count(out, "\n") != 1 {
			t.Fatalf("couchrepd %v printed %q, want one line with the version and the Go version", args, out)
		}
	}
}
