package httpapi

import (
	"regexp"

	"github.com/couchrep/couchrep/internal/replication"
)

// RedactURL returns an endpoint URL with its password shown as "*****", as
// CouchDB shows endpoints.
func RedactURL(u string) string { return replication.RedactURL(u) }

// userinfo matches the credentials of URLs inside free text.
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)([^/@\s"':]*):([^/@\s"']*)@`)

// basicHeader matches Authorization header values inside free text.
var basicHeader = regexp.MustCompile(`(?i)((?:authorization|proxy-authorization)["']?\s*[:=]\s*["']?(?:basic|bearer)\s+)[A-Za-z0-9+/=._-]+`)

// RedactText masks the passwords of URLs and Authorization header values
// appearing in s (an error message, a crash reason).
func RedactText(s string) string {
	s = userinfo.ReplaceAllString(s, "${1}${2}:*****@")
	return basicHeader.ReplaceAllString(s, "${1}*****")
}
