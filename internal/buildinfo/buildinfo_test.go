package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	const rev = "200e4b1f0e1a2b3c4d5e6f708192a3b4c5d6e7f8"
	setting := func(kv ...string) []debug.BuildSetting {
		var out []debug.BuildSetting
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want Info
		line string
	}{
		{
			name: "release from a clean tree",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/couchrep/couchrep", Version: "v1.2.0"},
				Settings: setting("vcs", "git", "vcs.revision", rev, "vcs.time", "2026-11-27T04:06:48Z", "vcs.modified", "false")},
			want: Info{Module: "github.com/couchrep/couchrep", Version: "v1.2.0", Revision: rev, Time: "2026-11-27T04:06:48Z", GoVersion: "go1.26.8"},
			line: "v1.2.0 (github.com/couchrep/couchrep, revision " + rev + ", 2026-11-27T04:06:48Z, go1.26.8)",
		},
		{
			name: "work tree with changes",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/couchrep/couchrep", Version: "v0.0.0-20261127040648-200e4b1f0e1a+dirty"},
				Settings: setting("vcs.revision", rev, "vcs.modified", "true")},
			want: Info{Module: "github.com/couchrep/couchrep", Version: "v0.0.0-20261127040648-200e4b1f0e1a+dirty", Revision: rev, Dirty: true, GoVersion: "go1.26.8"},
			line: "v0.0.0-20261127040648-200e4b1f0e1a+dirty (github.com/couchrep/couchrep, revision " + rev + ", dirty, go1.26.8)",
		},
		{
			name: "no VCS information",
			bi:   debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/couchrep/couchrep"}},
			want: Info{Module: "github.com/couchrep/couchrep", Version: "(devel)", GoVersion: "go1.26.8"},
			line: "(devel) (github.com/couchrep/couchrep, no VCS revision, go1.26.8)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := FromBuildInfo(&tc.bi)
			if got != tc.want {
				t.Fatalf("FromBuildInfo = %+v, want %+v", got, tc.want)
			}
			if s := got.String(); s != tc.line {
				t.Fatalf("String = %q, want %q", s, tc.line)
			}
		})
	}
}

// TestRead: a test binary has build information too: at least the Go
// version that built it.
func TestRead(t *testing.T) {
	if got := Read(); got.GoVersion != runtime.Version() {
		t.Fatalf("Read().GoVersion = %q, want %q", got.GoVersion, runtime.Version())
	}
}
