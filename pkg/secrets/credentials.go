package secrets

import (
	"net/url"
	"regexp"
	"strings"
)

// credentialMask replaces a credential in a URL or DSN.
const credentialMask = "xxxxx"

var (
	// credentialKey is a query parameter or DSN keyword that holds a
	// credential (password, sslpassword, passwd, pwd, secret, token,
	// api_key, access_key, auth, credentials, signature, ...).
	credentialKey = regexp.MustCompile(`(?i)(pass|pwd|secret|token|key|auth|cred|signature|sig$)`)
	// dsnPair is one keyword=value of a libpq keyword/value DSN, the value
	// bare or single-quoted with backslash escapes.
	dsnPair = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_.-]*)(\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s]*)`)
	// pathKeys name files, not credentials, although they match
	// credentialKey.
	pathKeys = map[string]bool{"sslkey": true, "sslcert": true, "sslrootcert": true, "sslcrl": true, "sslcrldir": true}
	// rawUserinfo is the userinfo of a URL that net/url cannot parse.
	rawUserinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s]*)@`)
)

// RedactCredentials returns s with every credential form a URL or a DSN
// can hold replaced by "xxxxx", for logging configuration and errors:
//
//   - the password of a URL's userinfo (postgres://user:xxxxx@host),
//     and the user of an http(s) URL without password, which is often a
//     token (https://xxxxx@github.com);
//   - query parameters whose name says credential: password=,
//     sslpassword=, token=, secret=, api_key=, auth=, sig=, ...
//     (postgres://host/db?password=xxxxx);
//   - the same keywords in a libpq keyword/value DSN
//     (host=db password=xxxxx);
//   - the whole userinfo of a URL that does not parse.
//
// Anything else is returned unchanged.
func RedactCredentials(s string) string {
	if s == "" {
		return s
	}
	if i := strings.Index(s, "://"); i > 0 && !strings.ContainsAny(s[:i], " \t=") {
		return redactURLCredentials(s)
	}
	if strings.Contains(s, "=") {
		return dsnPair.ReplaceAllStringFunc(s, func(pair string) string {
			m := dsnPair.FindStringSubmatch(pair)
			if m == nil || !isCredentialKey(m[1]) || m[3] == "" {
				return pair
			}
			return m[1] + m[2] + credentialMask
		})
	}
	return s
}

func redactURLCredentials(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return rawUserinfo.ReplaceAllString(s, "${1}"+credentialMask+"@")
	}
	changed := false
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), credentialMask)
			changed = true
		} else if (u.Scheme == "http" || u.Scheme == "https") && u.User.Username() != "" {
			u.User = url.User(credentialMask)
			changed = true
		}
	}
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			u.RawQuery = credentialMask
			changed = true
		} else {
			for k, vs := range q {
				if isCredentialKey(k) {
					for i := range vs {
						vs[i] = credentialMask
					}
					changed = true
				}
			}
			if changed {
				u.RawQuery = q.Encode()
			}
		}
	}
	if !changed {
		return s
	}
	return u.String()
}

func isCredentialKey(k string) bool {
	return credentialKey.MatchString(k) && !pathKeys[strings.ToLower(k)]
}
