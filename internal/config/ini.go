package config

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
)

// maxErrors bounds the errors one Parse reports.
const maxErrors = 20

// maxLine is the longest line Parse reads.
const maxLine = 1 << 20

// Load reads the ini file at path over Default. A file that cannot be read
// is an error naming it (errors.Is(err, fs.ErrNotExist) for a missing one);
// invalid settings are *Error values (joined when there are several).
func Load(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	return Parse(path, f)
}

// Parse reads an ini document named name (used in error messages) over
// Default. It checks every key and value but not the relations between
// settings; call Validate once environment and flags are applied.
//
// The syntax is CouchDB's: "[section]" headers, "key = value" lines, lines
// starting with ";" (or "#") are comments, and " ;" starts a comment after a
// value. An empty value means the default (CouchDB: deleting the key). A
// section may appear more than once; a key may not.
func Parse(name string, r io.Reader) (Config, error) {
	c := Default()
	c.own()
	p := parser{c: &c, name: name, seen: map[[2]string]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	for sc.Scan() {
		p.line++
		p.parseLine(sc.Text())
		if len(p.errs) >= maxErrors {
			break
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			p.errs = append(p.errs, &Error{File: name, Line: p.line + 1, Expected: "lines shorter than 1 MiB", Got: "a longer line"})
		} else {
			return Config{}, fmt.Errorf("config: reading %s: %w", name, err)
		}
	}
	if len(p.errs) > 0 {
		return Config{}, errors.Join(p.errs...)
	}
	return c, nil
}

// skipSection is the parser's section below an unknown or malformed
// header: its lines are skipped, the header having been reported.
const skipSection = "\x00skip"

// parser is one Parse in progress.
type parser struct {
	c       *Config
	name    string
	line    int
	section string
	seen    map[[2]string]int // (section, key) -> first line
	errs    []error
}

func (p *parser) fail(section, key, expected, got string) {
	p.errs = append(p.errs, &Error{File: p.name, Line: p.line, Section: section, Key: key, Expected: expected, Got: got})
}

func (p *parser) parseLine(raw string) {
	line := strings.TrimSpace(raw)
	if p.line == 1 {
		line = strings.TrimPrefix(line, "\ufeff")
	}
	if line == "" || line[0] == ';' || line[0] == '#' {
		return
	}
	if line[0] == '[' {
		end := strings.IndexByte(line, ']')
		rest := ""
		if end >= 0 {
			rest = strings.TrimSpace(line[end+1:])
		}
		if end < 0 || (rest != "" && rest[0] != ';' && rest[0] != '#') {
			p.fail("", "", `a section header such as "[replicator]"`, line)
			p.section = skipSection
			return
		}
		name := strings.TrimSpace(line[1:end])
		if !slices.Contains(sections, name) {
			p.fail("", "", "a known section (["+strings.Join(sections, "], [")+"])", "["+name+"]")
			p.section = skipSection
			return
		}
		p.section = name
		return
	}
	if p.section == skipSection {
		return
	}
	eq := strings.IndexByte(line, '=')
	if eq < 0 {
		p.fail(p.section, "", `"key = value", a "[section]" header or a "; comment"`, line)
		return
	}
	key := strings.TrimSpace(line[:eq])
	val := stripComment(strings.TrimSpace(line[eq+1:]))
	if p.section == "" {
		p.fail("", key, `a "[section]" header before the first key`, line)
		return
	}
	if key == "" {
		p.fail(p.section, "", "a key before \"=\"", line)
		return
	}
	id := [2]string{p.section, key}
	if first, dup := p.seen[id]; dup {
		p.fail(p.section, key, "each key once per file (first set on line "+strconv.Itoa(first)+")", key)
		return
	}
	p.seen[id] = p.line
	if err := p.c.set(origin{file: p.name, line: p.line}, p.section, key, val); err != nil {
		p.errs = append(p.errs, err)
	}
}

// stripComment removes a trailing " ;comment" or "\t;comment", as CouchDB's
// config parser does.
func stripComment(v string) string {
	for i := 1; i < len(v); i++ {
		if v[i] == ';' && (v[i-1] == ' ' || v[i-1] == '\t') {
			return strings.TrimSpace(v[:i])
		}
	}
	return v
}

// own gives c its own copies of its maps, so that set does not write into
// maps shared with a copy of c made by assignment.
func (c *Config) own() {
	c.Shares = maps.Clone(c.Shares)
	if c.Shares == nil {
		c.Shares = map[string]int{}
	}
	c.Admins = maps.Clone(c.Admins)
	if c.Admins == nil {
		c.Admins = map[string]string{}
	}
	c.origin = maps.Clone(c.origin)
	if c.origin == nil {
		c.origin = map[[2]string]origin{}
	}
}

// set applies one setting from where; an empty val restores the default.
// It returns an *Error for an unknown key or an invalid value. Call own
// first.
func (c *Config) set(where origin, section, key, val string) *Error {
	fail := func(expected, got string) *Error {
		return &Error{File: where.file, Line: where.line, Section: section, Key: key, Expected: expected, Got: got}
	}
	switch section {
	case SectionShares:
		if !validShareDB(key) {
			return fail(expectedShareDB, key)
		}
		if val == "" {
			delete(c.Shares, key)
			break
		}
		n, ok := shareValue(val)
		if !ok {
			return fail(expectedShare, val)
		}
		c.Shares[key] = n
	case SectionAdmins:
		if val == "" {
			delete(c.Admins, key)
			break
		}
		c.Admins[key] = val
	default:
		s, ok := lookup[[2]string{section, key}]
		if !ok {
			exp := "a known [" + section + "] key"
			if sug := suggest(section, key); sug != "" {
				exp += fmt.Sprintf(" (did you mean %q?)", sug)
			}
			return fail(exp, key)
		}
		if s.ignored != "" {
			c.Ignored = append(slices.Clip(c.Ignored), Ignored{Where: where.String(), Section: section, Key: key, Reason: s.ignored})
			return nil
		}
		if val == "" {
			d := Default()
			s.v.reset(c, &d)
		} else if !s.v.set(c, val) {
			return fail(s.v.expected(), val)
		}
	}
	c.origin[[2]string{section, key}] = where
	return nil
}

// String formats an origin as "file:line", "env NAME" or "flag --name".
func (o origin) String() string {
	if o.line > 0 {
		return o.file + ":" + strconv.Itoa(o.line)
	}
	return o.file
}
