package kv

// Durability is what a committed transaction survives, the same two
// levels on every backend (config's [couchrep] durability). Each backend's
// Options.Durability says how it provides them.
type Durability int

const (
	// DurabilityNormal (the default): a commit survives a crash of the
	// process that made it (kill -9); a crash of the machine or database
	// server may lose the last fraction of a second of commits, never part
	// of one. SQLite: WAL with synchronous=NORMAL. PostgreSQL:
	// synchronous_commit = off.
	DurabilityNormal Durability = iota
	// DurabilityFull: a commit is on disk when Transact returns and
	// survives power loss. SQLite: WAL with synchronous=FULL. PostgreSQL:
	// the server's synchronous_commit (on by default).
	DurabilityFull
)

// String returns the config spelling: "normal" or "full".
func (d Durability) String() string {
	if d == DurabilityFull {
		return "full"
	}
	return "normal"
}
