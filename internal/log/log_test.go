package log

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestParseLevel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want zerolog.Level
	}{
		{"trace", zerolog.TraceLevel}, {"debug", zerolog.DebugLevel}, {"info", zerolog.InfoLevel},
		{"notice", zerolog.InfoLevel}, {"warning", zerolog.WarnLevel}, {"WARN", zerolog.WarnLevel},
		{"error", zerolog.ErrorLevel}, {"critical", zerolog.FatalLevel}, {"alert", zerolog.FatalLevel},
		{"emergency", zerolog.FatalLevel}, {"none", zerolog.Disabled}, {" info ", zerolog.InfoLevel},
	}
	for _, tc := range tests {
		got, err := ParseLevel(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if _, err := ParseLevel("loud"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `"loud"`) {
		t.Errorf("ParseLevel(loud) = %v, want ErrInvalid naming the value", err)
	}
}

func TestNewJSON(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l, err := New(&buf, "info", "auto") // a buffer is not a terminal: JSON
	if err != nil {
		t.Fatal(err)
	}
	l.Debug().Msg("hidden")
	l.Info().Str("job", "j1").Int("n", 3).Str("url", "http://bob:s3cr3t@h/db").Msg("started")
	if strings.Contains(buf.String(), "s3cr3t") || !strings.Contains(buf.String(), "http://bob:*****@h/db") {
		t.Errorf("the log line shows a credential: %s", buf.String())
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d lines, want 1 (debug filtered):\n%s", len(lines), buf.String())
	}
	var ev map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &ev); err != nil {
		t.Fatalf("not JSON: %q: %v", lines[0], err)
	}
	for k, want := range map[string]any{"level": "info", "job": "j1", "n": 3.0, "message": "started"} {
		if ev[k] != want {
			t.Errorf("%s = %v, want %v", k, ev[k], want)
		}
	}
	if _, ok := ev["time"]; !ok {
		t.Error("no time field")
	}
}

// TestWith: a logger from With adds its field to every event (also through
// a child's own With, and beside zerolog's context), and costs one small
// allocation, not zerolog's 500-byte context buffer.
func TestWith(t *testing.T) {
	var buf bytes.Buffer
	base, err := New(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	l := With(With(base, "job_id", "j1"), "replication_id", "r1")
	l.Info().Int("n", 3).Msg("one")
	child := l.With().Str("actor", "a").Logger()
	child.Warn().Msg("two")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), buf.String())
	}
	for i, want := range []map[string]any{
		{"job_id": "j1", "replication_id": "r1", "n": 3.0, "message": "one"},
		{"job_id": "j1", "replication_id": "r1", "actor": "a", "message": "two"},
	} {
		var ev map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &ev); err != nil {
			t.Fatalf("not JSON: %q: %v", lines[i], err)
		}
		for k, v := range want {
			if ev[k] != v {
				t.Errorf("line %d: %s = %v, want %v", i+1, k, ev[k], v)
			}
		}
		if _, ok := ev["time"]; !ok {
			t.Errorf("line %d: no time field (the base logger's context)", i+1)
		}
	}
	if a := testing.AllocsPerRun(100, func() { _ = With(base, "job_id", "j1") }); a > 1 {
		t.Errorf("With allocates %.0f times, want at most 1 (the hook slice)", a)
	}
}

func TestNewConsole(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l, err := New(&buf, "debug", "console")
	if err != nil {
		t.Fatal(err)
	}
	l.Debug().Str("job", "j1").Msg("started")
	out := buf.String()
	if json.Valid(bytes.TrimSpace(buf.Bytes())) || !strings.Contains(out, "DBG") || !strings.Contains(out, "job=j1") || !strings.Contains(out, "started") {
		t.Errorf("console line = %q, want text with DBG, job=j1, started", out)
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("colors written to a non-terminal: %q", out)
	}
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ level, format, msg string }{
		{"loud", "json", `level "loud"`},
		{"info", "xml", `format "xml": expected auto, json or console`},
	} {
		if _, err := New(io.Discard, tc.level, tc.format); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("New(%q, %q) = %v, want ErrInvalid containing %s", tc.level, tc.format, err, tc.msg)
		}
	}
}

func TestIsTerminal(t *testing.T) {
	t.Parallel()
	if IsTerminal(&bytes.Buffer{}) {
		t.Error("a buffer is a terminal")
	}
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Error("a regular file is a terminal")
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if IsTerminal(null) {
		t.Error("/dev/null (a character device) is a terminal")
	}
}

func TestSlogHandler(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l, err := New(&buf, "debug", "json")
	if err != nil {
		t.Fatal(err)
	}
	s := slog.New(SlogHandler(l.With().Str("component", "protoactor").Logger()))
	s.Info("chatty")
	s.Debug("chattier")
	s.With("actor", "scheduler").WithGroup("g").Warn("mailbox full", "size", 10)
	s.Error("boom", "err", errors.New("bad"))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2 (warn and error only):\n%s", len(lines), buf.String())
	}
	var warn, errEv map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &warn); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &errEv); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"level": "warn", "message": "mailbox full", "component": "protoactor", "actor": "scheduler", "g.size": 10.0} {
		if warn[k] != want {
			t.Errorf("warn %s = %v, want %v (%s)", k, warn[k], want, lines[0])
		}
	}
	if errEv["level"] != "error" || errEv["message"] != "boom" {
		t.Errorf("error event = %s", lines[1])
	}

	// Siblings derived from one handler keep their own attributes.
	buf.Reset()
	parent := slog.New(SlogHandler(l)).With("shared", 1)
	a, b := parent.With("who", "a"), parent.With("who", "b")
	a.Warn("from a")
	b.Warn("from b")
	a.Warn("from a again")
	for i, want := range []string{`"shared":1,"who":"a"`, `"shared":1,"who":"b"`, `"shared":1,"who":"a"`} {
		got := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if i >= len(got) || !strings.Contains(got[i], want) || strings.Count(got[i], `"who"`) != 1 {
			t.Errorf("sibling line %d = %q, want one %s", i, got, want)
		}
	}

	// The logger's own level still applies.
	buf.Reset()
	quiet, _ := New(&buf, "error", "json")
	h := SlogHandler(quiet)
	if h.Enabled(t.Context(), slog.LevelWarn) {
		t.Error("warn enabled on an error-level logger")
	}
	if !h.Enabled(t.Context(), slog.LevelError) {
		t.Error("error disabled on an error-level logger")
	}
	slog.New(h).Warn("dropped")
	if buf.Len() != 0 {
		t.Errorf("wrote %q below the logger's level", buf.String())
	}
}

// TestSlogAttrKinds writes one attribute of every slog kind both ways a
// handler receives attributes (on the record, and through WithAttrs) and
// expects the same JSON field from each.
func TestSlogAttrKinds(t *testing.T) {
	t.Parallel()
	when := time.Date(2026, 11, 25, 18, 0, 0, 0, time.UTC)
	tests := []struct {
		attr slog.Attr
		key  string
		want string // the field's JSON
	}{
		{slog.String("s", "x"), "s", `"x"`},
		{slog.Int64("i", -3), "i", `-3`},
		{slog.Uint64("u", 7), "u", `7`},
		{slog.Float64("f", 1.5), "f", `1.5`},
		{slog.Bool("b", true), "b", `true`},
		{slog.Duration("d", 1500*time.Millisecond), "d", `1500`},
		{slog.Time("t", when), "t", `"2026-11-25T18:00:00Z"`},
		{slog.Any("err", errors.New("bad")), "err", `"bad"`},
		{slog.Any("a", []int{1, 2}), "a", `[1,2]`},
		{slog.Group("g", slog.Int("n", 1), slog.Group("h", slog.String("m", "y"))), "g.h.m", `"y"`},
		{slog.Group("", slog.Int("inline", 2)), "inline", `2`},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			for _, way := range []string{"record", "WithAttrs"} {
				var buf bytes.Buffer
				l, err := New(&buf, "info", "json")
				if err != nil {
					t.Fatal(err)
				}
				s := slog.New(SlogHandler(l))
				if way == "record" {
					s.LogAttrs(t.Context(), slog.LevelWarn, "m", tc.attr)
				} else {
					s.With(tc.attr).Warn("m")
				}
				var ev map[string]json.RawMessage
				if err := json.Unmarshal(buf.Bytes(), &ev); err != nil {
					t.Fatalf("%s: not JSON: %q: %v", way, buf.String(), err)
				}
				if got := string(ev[tc.key]); got != tc.want {
					t.Errorf("%s: %s = %s, want %s (%s)", way, tc.key, got, tc.want, buf.String())
				}
			}
		})
	}
}

func BenchmarkJSONEvent(b *testing.B) {
	l, err := New(io.Discard, "info", "json")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		l.Info().Str("job", "a81a78e822837e66df423d54279c15fe+continuous").Int("docs_written", 113).Msg("checkpoint")
	}
}

func BenchmarkSlogEvent(b *testing.B) {
	l, err := New(io.Discard, "info", "json")
	if err != nil {
		b.Fatal(err)
	}
	s := slog.New(SlogHandler(l))
	b.ReportAllocs()
	for b.Loop() {
		s.Warn("mailbox", "actor", "scheduler", "size", 10)
	}
}
