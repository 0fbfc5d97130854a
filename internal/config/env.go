package config

import (
	"errors"
	"strings"
)

// envPrefix starts every environment variable couchrep reads.
const envPrefix = "COUCHREP_"

// Environment variables of the map sections: a comma-separated list of
// name=value pairs, merged over the file's.
const (
	EnvShares = envPrefix + "REPLICATOR_SHARES" // e.g. "high/_replicator=200,low/_replicator=50"
	EnvAdmins = envPrefix + "ADMINS"            // e.g. "admin=secret"
)

// envSettings maps a variable name to its setting.
var envSettings = func() map[string]*setting {
	m := make(map[string]*setting, len(schema))
	for _, s := range schema {
		m[s.envName()] = s
	}
	return m
}()

// ApplyEnv applies COUCHREP_* variables from environ (os.Environ's "NAME=value"
// form) over c. A setting's variable is COUCHREP_<SECTION>_<KEY>, upper case,
// with "." and "-" replaced by "_": COUCHREP_COUCHREP_NODE_NAME,
// COUCHREP_REPLICATOR_MAX_JOBS, COUCHREP_LOG_LEVEL, COUCHREP_ADMIN_TOKEN,
// COUCHREP_COUCHDB_UUID. The map sections take one variable each, a
// comma-separated list of name=value pairs merged over the file's:
// COUCHREP_REPLICATOR_SHARES ("high/_replicator=200,_replicator=50") and
// COUCHREP_ADMINS ("admin=secret"; a password containing a comma must go in
// the file).
//
// Values are written exactly as in the file. Empty variables are ignored.
// A variable whose name starts with a known section's prefix
// (COUCHREP_REPLICATOR_, COUCHREP_LOG_, ...) but names no key is an error, so
// that typos do not pass silently; other COUCHREP_* variables are left to
// other tools. Errors are *Error values with File "env NAME".
func (c *Config) ApplyEnv(environ []string) error {
	var errs []error
	c.own()
	for _, kv := range environ {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, envPrefix) || val == "" {
			continue
		}
		where := origin{file: "env " + name}
		switch name {
		case EnvShares:
			errs = append(errs, c.setPairs(where, SectionShares, val)...)
			continue
		case EnvAdmins:
			errs = append(errs, c.setPairs(where, SectionAdmins, val)...)
			continue
		}
		if s, ok := envSettings[name]; ok {
			if err := c.set(where, s.section, s.key, strings.TrimSpace(val)); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		for _, sec := range sections {
			prefix := envPrefix + envPart(sec) + "_"
			if sec == SectionShares || sec == SectionAdmins || !strings.HasPrefix(name, prefix) {
				continue
			}
			key := strings.ToLower(strings.TrimPrefix(name, prefix))
			if err := c.set(where, sec, key, val); err != nil {
				errs = append(errs, err)
			}
			break
		}
	}
	return errors.Join(errs...)
}

// setPairs applies "k=v,k=v" to a map section.
func (c *Config) setPairs(where origin, section, list string) []error {
	var errs []error
	for _, pair := range strings.Split(list, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			errs = append(errs, &Error{File: where.file, Section: section, Expected: "name=value pairs separated by commas", Got: pair})
			continue
		}
		if err := c.set(where, section, k, v); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
