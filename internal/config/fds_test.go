package config

import (
	"strings"
	"testing"
)

func TestFileDescriptors(t *testing.T) {
	cfg := Default()
	cfg.Replicator.MaxJobs = 10000
	if got := cfg.FileDescriptors(); got != fdBase+20000 {
		t.Fatalf("budget for 10,000 jobs %d, want %d", got, fdBase+20000)
	}
	cfg.Couchrep.NodeTypes = []string{NodeTypeAPIFrontend}
	if got := cfg.FileDescriptors(); got != fdBase {
		t.Fatalf("budget of a node running no jobs %d, want %d", got, fdBase)
	}
	tests := []struct {
		need    int
		limit   uint64
		maxJobs int
		want    []string // substrings; none: no warning
	}{
		{need: 1256, limit: 1024, maxJobs: 500, want: []string{"ulimit -n) 1024", "1256", "max_jobs = 500", "lower max_jobs to 384"}},
		{need: 1256, limit: 1256, maxJobs: 500},
		{need: 20256, limit: 1 << 20, maxJobs: 10000},
	}
	for _, tt := range tests {
		got := fdWarning(tt.need, tt.limit, tt.maxJobs)
		if (got == "") != (len(tt.want) == 0) {
			t.Errorf("fdWarning(%d, %d) = %q", tt.need, tt.limit, got)
		}
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("fdWarning(%d, %d) = %q, want it to contain %q", tt.need, tt.limit, got, w)
			}
		}
	}
}
