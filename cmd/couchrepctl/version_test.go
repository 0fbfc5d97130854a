package main

import (
	"runtime"
	"strings"
	"testing"
)

// TestVersionFlag: --version prints one line with the build and exits 0,
// before or after a command, without asking any node.
func TestVersionFlag(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"--node", "127.0.0.1:1", "--version"}, {"tree", "--version"}} {
		out, errOut, code := ctl(args...)
		if code != exitOK || !strings.HasPrefix(out, "couchrepctl ") || !strings.Contains(out, runtime.Version()) || strings.Count(out, "\n") != 1 {
			t.Fatalf("couchrepctl %v: exit %d, stdout %q, stderr %q; want exit 0 and one version line", args, code, out, errOut)
		}
	}
}
