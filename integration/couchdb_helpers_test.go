package integration

import (
	"net/url"
	"strings"

	"github.com/couchrep/couchrep/internal/testserver"
)

// dbVia is database name of s as reached through the proxy at proxyURL
// (an httptest server forwarding to s): the database's path (prefixed on
// the CouchDB of make test-couchdb) on the proxy's host, with s's
// credentials, which the proxy forwards.
func dbVia(s *testserver.Server, proxyURL, name string) string {
	u, err := url.Parse(s.DBURL(name))
	p, err2 := url.Parse(proxyURL)
	if err != nil || err2 != nil {
		panic("dbVia: " + s.DBURL(name) + " " + proxyURL)
	}
	u.Host = p.Host
	return u.String()
}

// dbPath is the path of database name of s, "/<name>/" (prefixed on the
// CouchDB of make test-couchdb), as a proxy in front of s sees it.
func dbPath(s *testserver.Server, name string) string {
	return "/" + strings.TrimPrefix(s.DBURL(name), s.URL)
}

// noCreds is u without its userinfo: how couchrep and CouchDB show an
// endpoint (_active_tasks, _scheduler/jobs).
func noCreds(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	p.User = nil
	return p.String()
}
