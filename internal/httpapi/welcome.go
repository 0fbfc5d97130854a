package httpapi

import (
	"net/http"
	"runtime/debug"
	"strings"
)

// Version is couchrep's version as GET / reports it: the main module's
// version when the binary was built from a tagged module, else this
// development version.
var Version = buildVersion()

func buildVersion() string {
	const dev = "0.1.0-dev"
	bi, ok := debug.ReadBuildInfo()
	if !ok || bi.Main.Version == "" || bi.Main.Version == "(devel)" {
		return dev
	}
	return strings.TrimPrefix(bi.Main.Version, "v")
}

// Features are what GET / lists under "features": "scheduler" tells
// CouchDB clients that /_scheduler/jobs and /_scheduler/docs exist, as
// CouchDB's own welcome document does.
var Features = []string{"scheduler", "replicator", "fair-share", "status-page"}

// welcome is GET /: CouchDB's welcome document, which clients read to
// detect the server (its "couchdb" key is "couchrep" here), with the server
// uuid shared by the nodes of one store.
func (s *Server) welcome(w http.ResponseWriter, r *http.Request, _ string) error {
	writeJSON(w, http.StatusOK, map[string]any{
		"couchrep": "Welcome",
		"version":  Version,
		"uuid":     s.uuid,
		"features": Features,
		"vendor":   map[string]string{"name": "couchrep", "version": Version},
	})
	return nil
}
