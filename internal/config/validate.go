package config

import (
	"errors"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Validate checks every setting, including values set in Go, and the
// relations between settings. Errors are *Error values naming where the
// offending setting was last set (file and line, variable or flag), joined
// when there are several.
func (c Config) Validate() error {
	var errs []error
	fail := func(section, key, expected, got string) {
		o := c.origin[[2]string{section, key}]
		errs = append(errs, &Error{File: o.file, Line: o.line, Section: section, Key: key, Expected: expected, Got: got})
	}
	for _, s := range schema {
		if s.ignored == "" && !s.v.valid(&c) {
			fail(s.section, s.key, s.v.expected(), s.v.get(&c))
		}
	}
	for _, db := range slices.Sorted(maps.Keys(c.Shares)) {
		n := c.Shares[db]
		switch {
		case !validShareDB(db):
			fail(SectionShares, db, expectedShareDB, db)
		case n < MinShares || n > MaxShares:
			fail(SectionShares, db, expectedShare, strconv.Itoa(n))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Admins)) {
		if name == "" || strings.ContainsAny(name, "=\n") {
			fail(SectionAdmins, name, "a user name without \"=\"", name)
		} else if c.Admins[name] == "" {
			fail(SectionAdmins, name, expectedAdmin, "")
		}
	}
	r := c.Replicator
	if r.MinBackoff > r.MaxBackoff {
		fail(SectionReplicator, "max_backoff_penalty_sec",
			"at least min_backoff_penalty_sec ("+formatIn(r.MinBackoff, time.Second)+")", formatIn(r.MaxBackoff, time.Second))
	}
	if (r.CertFile == "") != (r.KeyFile == "") {
		key, got := "key_file", r.KeyFile
		if r.CertFile == "" {
			key, got = "cert_file", r.CertFile
		}
		fail(SectionReplicator, key, "cert_file and key_file set together", got)
	}
	if c.SSL.Enable && (c.SSL.CertFile == "" || c.SSL.KeyFile == "") {
		key, got := "cert_file", c.SSL.CertFile
		if c.SSL.CertFile != "" {
			key, got = "key_file", c.SSL.KeyFile
		}
		fail(SectionSSL, key, "a PEM file path (enable = true needs cert_file and key_file)", got)
	}
	if c.HasNodeType(NodeTypeAPIFrontend) && len(c.Admins) == 0 && c.Couchrep.AuthServer == "" && !c.Couchrep.AllowAdminParty &&
		c.Couchrep.HTTPBind != "" && !IsLoopback(c.Couchrep.HTTPBind) {
		fail(SectionCouchrep, "http_bind", "a loopback address while [admins] is empty: the HTTP API would be open to every "+
			"machine that reaches it (add `[admins] <name> = <password>` or `[couchrep] auth_server`, or set `[couchrep] allow_admin_party = true` to serve it open anyway)",
			c.Couchrep.HTTPBind)
	}
	if c.Couchrep.HTTPBind != "" && c.Couchrep.HTTPBind == c.Couchrep.AdminBind && !strings.HasSuffix(c.Couchrep.HTTPBind, ":0") {
		fail(SectionCouchrep, "admin_bind", "an address other than http_bind", c.Couchrep.AdminBind)
	}
	return errors.Join(errs...)
}

// IsLoopback reports whether a listen address (host:port) only accepts
// connections from this machine: 127.0.0.0/8, ::1 or "localhost".
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
