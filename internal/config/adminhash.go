package config

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// IsPasswordHash reports whether an [admins] value is one of CouchDB's
// password hashes ("-pbkdf2-...", "-pbkdf2:sha256-...", "-hashed-...")
// rather than a plain password.
func IsPasswordHash(v string) bool {
	return strings.HasPrefix(v, "-pbkdf2-") || strings.HasPrefix(v, "-pbkdf2:") || strings.HasPrefix(v, "-hashed-")
}

// ErrAdminsNotRewritten is wrapped by HashAdmins' error when a file that
// sets a plain [admins] password could not be rewritten with its hash (a
// read-only /etc, as under systemd's ProtectSystem=strict, or a file the
// node's user may not write). The passwords are hashed in memory all the
// same: the node can run, and the file still holds them in plain text.
var ErrAdminsNotRewritten = errors.New("config: plain [admins] passwords hashed in memory only")

// HashAdmins replaces every plain [admins] password with hash(password),
// as CouchDB does when it starts: in c, and in the ini file that set it,
// where only that line's value changes (comments, order, the other lines
// and the value's inline comment are kept; the file is replaced
// atomically). Passwords set by environment variables or flags are hashed
// in memory only. It returns the names whose passwords were hashed and the
// files rewritten. A file that cannot be rewritten is an error wrapping
// ErrAdminsNotRewritten (and naming the file, never a password), after
// every password in c was hashed: the caller may go on with c.
func (c *Config) HashAdmins(hash func(password string) (string, error)) (names, files []string, err error) {
	type edit struct {
		line                int
		name, plain, hashed string
	}
	edits := map[string][]edit{}
	for _, name := range slices.Sorted(maps.Keys(c.Admins)) {
		plain := c.Admins[name]
		if plain == "" || IsPasswordHash(plain) {
			continue
		}
		h, err := hash(plain)
		if err != nil {
			return names, files, fmt.Errorf("config: hashing the password of [admins] %s: %w", name, err)
		}
		c.Admins[name] = h
		names = append(names, name)
		if o := c.origin[[2]string{SectionAdmins, name}]; o.line > 0 && o.file != "" {
			edits[o.file] = append(edits[o.file], edit{o.line, name, plain, h})
		}
	}
	var notRewritten []error
	for _, file := range slices.Sorted(maps.Keys(edits)) {
		data, err := os.ReadFile(file)
		if err != nil {
			notRewritten = append(notRewritten, fmt.Errorf("rewriting %s with hashed [admins] passwords: %w", file, err))
			continue
		}
		lines := strings.Split(string(data), "\n")
		changed := false
		for _, e := range edits[file] {
			if e.line > len(lines) {
				continue
			}
			if l, ok := replaceIniValue(lines[e.line-1], e.name, e.plain, e.hashed); ok {
				lines[e.line-1], changed = l, true
			}
		}
		if !changed {
			continue
		}
		text := strings.Join(lines, "\n")
		if err := placeFile(filepath.Dir(file), filepath.Base(file), strings.TrimSuffix(text, "\n"), os.Rename); err != nil {
			notRewritten = append(notRewritten, err)
			continue
		}
		files = append(files, file)
	}
	if len(notRewritten) > 0 {
		return names, files, fmt.Errorf("%w: %w", ErrAdminsNotRewritten, errors.Join(notRewritten...))
	}
	return names, files, nil
}

// replaceIniValue rewrites "name = plain[ ;comment]" as "name = hashed[ ;comment]",
// keeping the spacing; ok is false when the line does not hold exactly that.
func replaceIniValue(line, name, plain, hashed string) (string, bool) {
	cr := ""
	if strings.HasSuffix(line, "\r") {
		line, cr = line[:len(line)-1], "\r"
	}
	eq := strings.IndexByte(line, '=')
	if eq < 0 || strings.TrimSpace(line[:eq]) != name {
		return line + cr, false
	}
	rest := line[eq+1:]
	val, comment := rest, ""
	for i := 1; i < len(rest); i++ { // an inline comment, as stripComment finds it
		if rest[i] == ';' && (rest[i-1] == ' ' || rest[i-1] == '\t') && strings.TrimSpace(rest[:i]) != "" {
			val, comment = rest[:i-1], rest[i-1:]
			break
		}
	}
	if strings.TrimSpace(val) != plain {
		return line + cr, false
	}
	lead := val[:len(val)-len(strings.TrimLeft(val, " \t"))]
	return line[:eq+1] + lead + hashed + comment + cr, true
}
