package config

import (
	"strconv"
	"strings"
)

// Error is one invalid setting: where it came from, which key, what was
// expected and what was found. It wraps ErrInvalid.
//
// Its message reads, for a file,
//
//	couchrep.ini:12: [replicator] max_jobs: expected a non-negative integer, got "abc"
//
// and for an environment variable File names it ("env
// COUCHREP_REPLICATOR_MAX_JOBS") and Line is 0. Validate names a flag as
// "flag --http"; errors about a value set in Go have no File.
type Error struct {
	// File is the config file's name, or "env NAME" / "flag --name";
	// empty for a value set in Go (and in the error fs.Parse reports, which
	// names the flag itself).
	File string
	// Line is the 1-based line in File, 0 when not from a file.
	Line int
	// Section and Key name the setting; Key is empty for section-level
	// and syntax errors.
	Section string
	Key     string
	// Expected says what would have been valid.
	Expected string
	// Got is the offending text as written (or as formatted from Go).
	Got string
}

// Error implements error.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	if e.Section != "" {
		b.WriteByte('[')
		b.WriteString(e.Section)
		b.WriteByte(']')
		if e.Key != "" {
			b.WriteByte(' ')
			b.WriteString(e.Key)
		}
		b.WriteString(": ")
	}
	b.WriteString("expected ")
	b.WriteString(e.Expected)
	b.WriteString(", got ")
	b.WriteString(strconv.Quote(e.Got))
	return b.String()
}

// Unwrap returns ErrInvalid, so errors.Is(err, ErrInvalid) holds.
func (e *Error) Unwrap() error { return ErrInvalid }
