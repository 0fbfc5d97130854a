// Package integration holds couchrep's slow tests: real couchrepd and
// couchrepctl processes, real CouchDB-protocol servers (PouchDB Server from
// npm, installed by `make testdeps`), several nodes sharing one store file,
// and chaos. `go test -short` skips them all.
package integration
