package config

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// value is one typed setting: it parses and range-checks the text form,
// range-checks the Go form (for Configs built in Go) and formats the Go form
// back into the text form.
type value interface {
	// set parses s into c; false means s is not valid.
	set(c *Config, s string) bool
	// valid reports whether c's current value is in range.
	valid(c *Config) bool
	// get formats c's current value as the file would spell it.
	get(c *Config) string
	// expected describes the valid values, for error messages.
	expected() string
	// reset copies d's value (the default) into c.
	reset(c, d *Config)
}

// intValue is an integer in [min, max]; with infinity, 0 is spelled
// "infinity" and means no limit.
type intValue struct {
	p        func(*Config) *int
	min, max int
	infinity bool
}

func (v intValue) set(c *Config, s string) bool {
	if v.infinity && s == "infinity" {
		*v.p(c) = 0
		return true
	}
	n, err := strconv.Atoi(s)
	if err != nil || !v.inRange(n) {
		return false
	}
	*v.p(c) = n
	return true
}

func (v intValue) inRange(n int) bool { return n >= v.min && n <= v.max }

func (v intValue) valid(c *Config) bool {
	n := *v.p(c)
	return (v.infinity && n == 0) || v.inRange(n)
}

func (v intValue) get(c *Config) string {
	n := *v.p(c)
	if v.infinity && n == 0 {
		return "infinity"
	}
	return strconv.Itoa(n)
}

func (v intValue) expected() string {
	var s string
	switch {
	case v.min == 0 && v.max == math.MaxInt:
		s = "a non-negative integer"
	case v.min == 1 && v.max == math.MaxInt:
		s = "a positive integer"
	default:
		s = fmt.Sprintf("an integer from %d to %d", v.min, v.max)
	}
	if v.infinity {
		s += ` or "infinity"`
	}
	return s
}

// durationValue is a time.Duration written either as a whole number in
// CouchDB's unit for the key or as a Go duration string ("30s", "1m30s").
// With infinity, 0 is spelled "infinity" and means no limit.
type durationValue struct {
	p        func(*Config) *time.Duration
	unit     time.Duration
	min, max time.Duration // max 0: unbounded
	infinity bool
}

func (v durationValue) set(c *Config, s string) bool {
	if v.infinity && s == "infinity" {
		*v.p(c) = 0
		return true
	}
	d, ok := parseDuration(s, v.unit)
	if !ok || !v.inRange(d) {
		return false
	}
	*v.p(c) = d
	return true
}

// parseDuration parses a whole number of unit, or a Go duration string.
func parseDuration(s string, unit time.Duration) (time.Duration, bool) {
	if s == "" {
		return 0, false
	}
	if isDigits(s) {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n > int64(math.MaxInt64/unit) {
			return 0, false
		}
		return time.Duration(n) * unit, true
	}
	if s[0] == '-' || s[0] == '+' {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, false
	}
	return d, true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

func (v durationValue) inRange(d time.Duration) bool {
	return d >= v.min && (v.max == 0 || d <= v.max)
}

func (v durationValue) valid(c *Config) bool {
	d := *v.p(c)
	return (v.infinity && d == 0) || v.inRange(d)
}

func (v durationValue) get(c *Config) string {
	d := *v.p(c)
	if v.infinity && d == 0 {
		return "infinity"
	}
	if d%v.unit == 0 {
		return strconv.FormatInt(int64(d/v.unit), 10)
	}
	return d.String()
}

func (v durationValue) expected() string {
	s := "a whole number of " + unitName(v.unit)
	switch {
	case v.max > 0:
		s += fmt.Sprintf(" from %s to %s", formatIn(v.min, v.unit), formatIn(v.max, v.unit))
	case v.min > 0:
		s += fmt.Sprintf(" (at least %s)", formatIn(v.min, v.unit))
	}
	s += ` or a duration such as "30s"`
	if v.infinity {
		s += `, or "infinity"`
	}
	return s
}

func unitName(u time.Duration) string {
	switch u {
	case time.Millisecond:
		return "milliseconds"
	case time.Second:
		return "seconds"
	case time.Hour:
		return "hours"
	}
	return u.String()
}

// formatIn spells d in unit when it divides evenly, else as a Go duration.
func formatIn(d, unit time.Duration) string {
	if d%unit == 0 {
		return strconv.FormatInt(int64(d/unit), 10)
	}
	return d.String()
}

// boolValue is "true" or "false", as CouchDB's config:get_boolean reads.
type boolValue struct {
	p func(*Config) *bool
}

func (v boolValue) set(c *Config, s string) bool {
	switch s {
	case "true":
		*v.p(c) = true
	case "false":
		*v.p(c) = false
	default:
		return false
	}
	return true
}

func (v boolValue) valid(*Config) bool      { return true }
func (v boolValue) reset(c, d *Config)      { *v.p(c) = *v.p(d) }
func (v intValue) reset(c, d *Config)       { *v.p(c) = *v.p(d) }
func (v durationValue) reset(c, d *Config)  { *v.p(c) = *v.p(d) }
func (v floatValue) reset(c, d *Config)     { *v.p(c) = *v.p(d) }
func (v stringValue) reset(c, d *Config)    { *v.p(c) = *v.p(d) }
func (v listValue) reset(c, d *Config)      { *v.p(c) = slices.Clone(*v.p(d)) }
func (ignoredValue) reset(_, _ *Config)     {}
func (v boolValue) get(c *Config) string    { return strconv.FormatBool(*v.p(c)) }
func (v boolValue) expected() string        { return "true or false" }
func (v floatValue) valid(c *Config) bool   { return v.inRange(*v.p(c)) }
func (v floatValue) get(c *Config) string   { return strconv.FormatFloat(*v.p(c), 'g', -1, 64) }
func (v floatValue) inRange(f float64) bool { return f >= v.min && f <= v.max }

// floatValue is a number in [min, max].
type floatValue struct {
	p        func(*Config) *float64
	min, max float64
}

func (v floatValue) set(c *Config, s string) bool {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || !v.inRange(f) {
		return false
	}
	*v.p(c) = f
	return true
}

func (v floatValue) expected() string {
	return fmt.Sprintf("a number from %g to %g", v.min, v.max)
}

// stringValue is free text checked by ok (nil: anything). With optional, the
// empty string is valid in a Config built in Go (meaning "derived").
type stringValue struct {
	p        func(*Config) *string
	ok       func(string) bool
	optional bool
	what     string
}

func (v stringValue) set(c *Config, s string) bool {
	if v.ok != nil && !v.ok(s) {
		return false
	}
	*v.p(c) = s
	return true
}

func (v stringValue) valid(c *Config) bool {
	s := *v.p(c)
	if s == "" {
		return v.optional
	}
	return v.ok == nil || v.ok(s)
}

func (v stringValue) get(c *Config) string { return *v.p(c) }
func (v stringValue) expected() string     { return v.what }

// listValue is a comma-separated list; items are trimmed, empty items
// dropped, duplicates removed. With allowed, every item must be one of them.
type listValue struct {
	p        func(*Config) *[]string
	allowed  []string
	item     func(string) bool
	nonEmpty bool
	what     string
}

func (v listValue) set(c *Config, s string) bool {
	var items []string
	for _, it := range strings.Split(s, ",") {
		it = strings.TrimSpace(it)
		if it == "" || slices.Contains(items, it) {
			continue
		}
		items = append(items, it)
	}
	if !v.validItems(items) {
		return false
	}
	*v.p(c) = items
	return true
}

func (v listValue) validItems(items []string) bool {
	if v.nonEmpty && len(items) == 0 {
		return false
	}
	for _, it := range items {
		if v.allowed != nil && !slices.Contains(v.allowed, it) {
			return false
		}
		if v.item != nil && !v.item(it) {
			return false
		}
	}
	return true
}

func (v listValue) valid(c *Config) bool { return v.validItems(*v.p(c)) }
func (v listValue) get(c *Config) string { return strings.Join(*v.p(c), ",") }
func (v listValue) expected() string     { return v.what }

// ignoredValue accepts any text and keeps nothing: a CouchDB key that has no
// meaning for couchrep.
type ignoredValue struct{}

func (ignoredValue) set(*Config, string) bool { return true }
func (ignoredValue) valid(*Config) bool       { return true }
func (ignoredValue) get(*Config) string       { return "" }
func (ignoredValue) expected() string         { return "any value" }
