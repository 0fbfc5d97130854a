package config

import (
	"flag"
)

// flagSpec binds a command-line flag to a setting.
type flagSpec struct {
	name, section, key, usage string
}

// flags are the settings RegisterFlags exposes.
var flags = []flagSpec{
	{"data", SectionCouchrep, "data_dir", "data `directory` (server UUID, node name, default store location) ([couchrep] data_dir)"},
	{"store", SectionCouchrep, "store", "job store: the embedded store `file` (default <data>/couchrep.db), or postgres://user:pass@host:5432/db for PostgreSQL ([couchrep] store)"},
	{"http", SectionCouchrep, "http_bind", "HTTP API listen `address` host:port ([couchrep] http_bind)"},
	{"admin", SectionCouchrep, "admin_bind", "admin endpoint listen `address` host:port ([couchrep] admin_bind)"},
	{"node-name", SectionCouchrep, "node_name", "this node's `name` (default couchrep-<id>@<hostname>, kept in the data directory) ([couchrep] node_name)"},
	{"node-types", SectionCouchrep, "node_types", "comma-separated node `types`: replication, api_frontend ([couchrep] node_types)"},
	{"log-level", SectionLog, "level", "least severe `level` logged: trace, debug, info, notice, warning, error, critical, none ([log] level)"},
	{"log-format", SectionLog, "format", "log `format`: auto (console on a terminal, else json), json, console ([log] format)"},
}

// RegisterFlags defines couchrepd's setting flags on fs, bound to c:
// --data, --store, --http, --admin, --node-name, --node-types, --log-level
// and --log-format (not --config: the command owns that one). A flag's value
// is parsed and applied to c when fs.Parse sees it, so call RegisterFlags
// after loading the file and applying the environment to get the precedence
// defaults < file < environment < flags. An invalid value makes fs.Parse
// fail with the *Error in its message: `invalid value "x" for flag -http:
// [couchrep] http_bind: expected host:port such as "127.0.0.1:5986", got "x"`.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	for _, f := range flags {
		fs.Var(&flagValue{c: c, spec: f}, f.name, f.usage)
	}
}

// flagValue is a flag.Value that sets one setting of a Config.
type flagValue struct {
	c    *Config
	spec flagSpec
}

// String returns the current value (flag.PrintDefaults shows it as the
// default).
func (v *flagValue) String() string {
	if v == nil || v.c == nil {
		return ""
	}
	s := lookup[[2]string{v.spec.section, v.spec.key}]
	return s.v.get(v.c)
}

// Set applies s to the bound Config.
func (v *flagValue) Set(s string) error {
	v.c.own()
	if err := v.c.set(origin{file: "flag --" + v.spec.name}, v.spec.section, v.spec.key, s); err != nil {
		err.File = "" // the flag package's message already names the flag
		return err
	}
	return nil
}
