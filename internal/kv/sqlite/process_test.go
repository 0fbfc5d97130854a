package sqlite

import "github.com/couchrep/couchrep/internal/kv/kvtest"

// childRoles are this backend's own multi-process roles.
var childRoles = map[string]kvtest.ChildRole{}
