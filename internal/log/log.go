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
	"time"

	"github.com/couchrep/couchrep/internal/redact"
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
// ParseFormat). Every event carries a timestamp; every line passes through
// redact.Text, so it shows no credential. With FormatAuto the
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
	w = redact.Writer(w) // no credential in any log line
	if f == FormatConsole || (f == FormatAuto && tty) {
		w = zerolog.ConsoleWriter{Out: w, NoColor: !tty, TimeFormat: "2006-01-02T15:04:05.000Z07:00"}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// With returns l with key=value added to every event it logs, as
// l.With().Str(key, value).Logger() does, but holding a few dozen bytes
// where zerolog's With allocates a 500-byte context buffer: for the loggers
// of long-lived objects there are thousands of (one per running job). The
// field comes after the event's own fields, before the message.
func With(l zerolog.Logger, key, value string) zerolog.Logger {
	return l.Hook(strField{key, value})
}

// strField is With's hook.
type strField struct{ key, value string }

// Run implements zerolog.Hook.
func (f strField) Run(e *zerolog.Event, _ zerolog.Level, _ string) { e.Str(f.key, f.value) }

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
// (warn) or above reach l, and then only if l's own level allows them. slog
// attributes become zerolog fields; a group's attributes are prefixed with
// the group name and a dot ("g.size"). The event's time is l's (New adds a
// timestamp to every event), not the record's.
//
// zerolog.NewSlogHandler is not used: it applies a group to attributes
// added before the group was opened, which slog's contract forbids.
func SlogHandler(l zerolog.Logger) slog.Handler {
	return slogHandler{ctx: l.With(), min: SlogLevel}
}

// slogHandler is a slog.Handler over a zerolog context.
type slogHandler struct {
	ctx    zerolog.Context // the logger with the attributes added so far
	prefix string          // open groups, "a.b."
	min    slog.Level
}

// Enabled implements slog.Handler.
func (h slogHandler) Enabled(_ context.Context, level slog.Level) bool {
	if level < h.min {
		return false
	}
	l := h.ctx.Logger()
	return l.GetLevel() <= zerologLevel(level) && zerologLevel(level) >= zerolog.GlobalLevel()
}

// Handle implements slog.Handler.
func (h slogHandler) Handle(ctx context.Context, r slog.Record) error {
	if !h.Enabled(ctx, r.Level) {
		return nil
	}
	l := h.ctx.Logger()
	ev := l.WithLevel(zerologLevel(r.Level))
	if ev == nil {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		addAttr(ev, h.prefix, a)
		return true
	})
	ev.Msg(r.Message)
	return nil
}

// WithAttrs implements slog.Handler.
func (h slogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	// A fresh copy: zerolog.Context values share their field buffer, and
	// two handlers derived from h must not write into each other's.
	l := h.ctx.Logger()
	ctx := l.With()
	for _, a := range attrs {
		ctx = addAttr(ctx, h.prefix, a)
	}
	h.ctx = ctx
	return h
}

// WithGroup implements slog.Handler.
func (h slogHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	h.prefix += name + "."
	return h
}

// zerologLevel maps a slog level to zerolog's.
func zerologLevel(l slog.Level) zerolog.Level {
	switch {
	case l < slog.LevelDebug:
		return zerolog.TraceLevel
	case l < slog.LevelInfo:
		return zerolog.DebugLevel
	case l < slog.LevelWarn:
		return zerolog.InfoLevel
	case l < slog.LevelError:
		return zerolog.WarnLevel
	}
	return zerolog.ErrorLevel
}

// fields is what a zerolog *Event and a zerolog Context have in common: the
// typed field adders addAttr uses, each returning the receiver's kind.
type fields[T any] interface {
	Str(key, val string) T
	Int64(key string, i int64) T
	Uint64(key string, i uint64) T
	Float64(key string, f float64) T
	Bool(key string, b bool) T
	Dur(key string, d time.Duration) T
	Time(key string, t time.Time) T
	AnErr(key string, err error) T
	Interface(key string, i any) T
}

// addAttr adds a slog attribute to an event (Handle) or a logger context
// (WithAttrs), groups flattened with dots, and returns the result.
func addAttr[T fields[T]](f T, prefix string, a slog.Attr) T {
	v := a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return f
	}
	key := prefix + a.Key
	switch v.Kind() {
	case slog.KindGroup:
		p := prefix
		if a.Key != "" {
			p = key + "."
		}
		for _, ga := range v.Group() {
			f = addAttr(f, p, ga)
		}
		return f
	case slog.KindString:
		return f.Str(key, v.String())
	case slog.KindInt64:
		return f.Int64(key, v.Int64())
	case slog.KindUint64:
		return f.Uint64(key, v.Uint64())
	case slog.KindFloat64:
		return f.Float64(key, v.Float64())
	case slog.KindBool:
		return f.Bool(key, v.Bool())
	case slog.KindDuration:
		return f.Dur(key, v.Duration())
	case slog.KindTime:
		return f.Time(key, v.Time())
	}
	if err, ok := v.Any().(error); ok {
		return f.AnErr(key, err)
	}
	return f.Interface(key, v.Any())
}
