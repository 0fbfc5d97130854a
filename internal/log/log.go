// Package log builds couchrep's zerolog logger: JSON lines by default, a
// human console format when writing to a terminal, and a slog.Handler that
// feeds libraries logging through log/slog (protoactor-go) into the same
// logger.
//
// Levels use CouchDB's [log] level names (debug, info, notice, warning,
// error, critical, alert, emergency, none) plus trace, warn and disabled.
// zerolog has fewer levels: notice is info, and critical, alert and
// emergency are zerolog's fatal level (as a threshold only: nothing here
// exits the process).
package log

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// ErrInvalid is wrapped by errors about an unknown level or format.
var ErrInvalid = errors.New("log: invalid setting")

// Formats accepted by New.
const (
	// FormatAuto is FormatConsole when the writer is a terminal, else
	// FormatJSON.
	FormatAuto = "auto"
	// FormatJSON writes one JSON object per line.
	FormatJSON = "json"
	// FormatConsole writes human-readable lines (colored on a terminal).
	FormatConsole = "console"
)

// levels maps every accepted level name to zerolog's level, in order of
// severity for LevelNames.
var levels = []struct {
	name  string
	level zerolog.Level
}{
	{"trace", zerolog.TraceLevel},
	{"debug", zerolog.DebugLevel},
	{"info", zerolog.InfoLevel},
	{"notice", zerolog.InfoLevel},
	{"warn", zerolog.WarnLevel},
	{"warning", zerolog.WarnLevel},
	{"error", zerolog.ErrorLevel},
	{"critical", zerolog.FatalLevel},
	{"alert", zerolog.FatalLevel},
	{"emergency", zerolog.FatalLevel},
	{"none", zerolog.Disabled},
	{"disabled", zerolog.Disabled},
}

// LevelNames lists the accepted level names, least severe first.
func LevelNames() []string {
	names := make([]string, len(levels))
	for i, l := range levels {
		names[i] = l.name
	}
	return names
}

// ParseLevel maps a level name (case-insensitive) to zerolog's level.
func ParseLevel(name string) (zerolog.Level, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	for _, l := range levels {
		if l.name == n {
			return l.level, nil
		}
	}
	return zerolog.NoLevel, fmt.Errorf("%w: level %q: expected one of %s", ErrInvalid, name, strings.Join(LevelNames(), ", "))
}

// ParseFormat checks a format name (case-insensitive) and returns it in
// lower case.
func ParseFormat(name string) (string, error) {
	switch f := strings.ToLower(strings.TrimSpace(name)); f {
	case FormatAuto, FormatJSON, FormatConsole:
		return f, nil
	}
	return "", fmt.Errorf("%w: format %q: expected auto, json or console", ErrInvalid, name)
}

// New returns a logger writing to w at level in format (see ParseLevel,
// ParseFormat). Every event carries a timestamp. With FormatAuto the
// console format is used when w is a terminal.
func New(w io.Writer, level, format string) (zerolog.Logger, error) {
	lvl, err := ParseLevel(level)
	if err != nil {
		return zerolog.Nop(), err
	}
	f, err := ParseFormat(format)
	if err != nil {
		return zerolog.Nop(), err
	}
	tty := IsTerminal(w)
	if f == FormatConsole || (f == FormatAuto && tty) {
		w = zerolog.ConsoleWriter{Out: w, NoColor: !tty, TimeFormat: "2006-01-02T15:04:05.000Z07:00"}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// IsTerminal reports whether w is a terminal (a character device that is a
// TTY), the test FormatAuto uses.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fd := f.Fd()
	return isatty.IsTerminal(fd) || isatty.IsCygwinTerminal(fd)
}

// SlogLevel is the least severe slog level SlogHandler passes on.
const SlogLevel = slog.LevelWarn

// SlogHandler returns a slog.Handler that writes to l, for libraries that log
// through log/slog (protoactor-go's actor system). Only records at SlogLevel
// (warn) or above reach l, and then only if l's own level allows them; slog
// attributes become zerolog fields, groups become dotted prefixes.
func SlogHandler(l zerolog.Logger) slog.Handler {
	return minLevelHandler{next: zerolog.NewSlogHandler(l), min: SlogLevel}
}

// minLevelHandler drops records below min before they reach next.
type minLevelHandler struct {
	next slog.Handler
	min  slog.Level
}

// Enabled implements slog.Handler.
func (h minLevelHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= h.min && h.next.Enabled(ctx, level)
}

// Handle implements slog.Handler.
func (h minLevelHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < h.min {
		return nil
	}
	return h.next.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h minLevelHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevelHandler{next: h.next.WithAttrs(attrs), min: h.min}
}

// WithGroup implements slog.Handler.
func (h minLevelHandler) WithGroup(name string) slog.Handler {
	return minLevelHandler{next: h.next.WithGroup(name), min: h.min}
}
