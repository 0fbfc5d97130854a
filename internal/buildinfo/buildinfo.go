// Package buildinfo says which build a binary is: its module version, the
// VCS revision it was built from (and whether the work tree had changes)
// and the Go version, from the information the Go toolchain embeds
// (runtime/debug.ReadBuildInfo). couchrepd --version and couchrepctl
// --version print it. It depends on nothing of ours.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Info is what a binary knows about its build.
type Info struct {
	// Module is the main module's path (github.com/couchrep/couchrep).
	Module string
	// Version is the main module's version: a release tag, a
	// pseudo-version, or "(devel)" for a build without VCS information.
	Version string
	// Revision is the VCS revision (a git commit), "" when the build
	// recorded none (go build -buildvcs=false, or outside a repository).
	Revision string
	// Time is the revision's commit time (RFC 3339), "" when unknown.
	Time string
	// Dirty: the work tree had uncommitted changes at build time.
	Dirty bool
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Read returns the running binary's build information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "(unknown)"}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo extracts an Info from the toolchain's build information.
func FromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Module: bi.Main.Path, Version: bi.Main.Version, GoVersion: bi.GoVersion}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Dirty = s.Value == "true"
		}
	}
	if in.Version == "" {
		in.Version = "(devel)"
	}
	return in
}

// String is the one line --version prints after the program's name:
//
//	v1.2.0 (github.com/couchrep/couchrep, revision 200e4b1f…, 2026-11-27T04:06:48Z, go1.26.8)
//
// with the whole 40-digit revision, and ", dirty" after it for a work tree
// with uncommitted changes.
func (in Info) String() string {
	var parts []string
	if in.Module != "" {
		parts = append(parts, in.Module)
	}
	if in.Revision != "" {
		parts = append(parts, "revision "+in.Revision)
	} else {
		parts = append(parts, "no VCS revision")
	}
	if in.Dirty {
		parts = append(parts, "dirty")
	}
	if in.Time != "" {
		parts = append(parts, in.Time)
	}
	if in.GoVersion != "" {
		parts = append(parts, in.GoVersion)
	}
	return fmt.Sprintf("%s (%s)", in.Version, strings.Join(parts, ", "))
}
