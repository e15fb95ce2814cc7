// Package redact keeps credentials out of log lines and error messages. A
// URL or DSN is shown as where it points, never how it logs in: a URL
// keeps its scheme, host and path, a DSN its user, address and database;
// userinfo, passwords, every query or parameter value and a fragment are
// replaced. url.URL.Redacted hides only a userinfo password: a gateway's
// ?api_key= would be written out whole.
//
// A path is kept: it says which endpoint is meant. A secret never belongs
// in one (a path containing '@' is taken for a password written without
// percent-encoding, and replaced too).
package redact

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Mask is what stands in for a replaced part.
const Mask = "xxxxx"

// URL is s with its userinfo, every query value and its fragment replaced
// by Mask: scheme://xxxxx@host/path?key=xxxxx#xxxxx. Text that does not
// parse as a URL shows nothing of itself.
func URL(s string) string {
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	if err != nil {
		return "(not a URL)"
	}
	var b strings.Builder
	if u.Scheme != "" {
		b.WriteString(u.Scheme + ":")
	}
	if u.Opaque != "" {
		// scheme:opaque (mailto:..., or host:port written without a
		// scheme): no part of it is known to be harmless.
		b.WriteString(Mask)
		return b.String()
	}
	if u.Host != "" || u.User != nil || strings.HasPrefix(s[len(u.Scheme):], "://") {
		b.WriteString("//")
	}
	if u.User != nil {
		b.WriteString(Mask + "@")
	}
	b.WriteString(u.Host)
	switch {
	case strings.Contains(u.Path, "@"):
		b.WriteString("/" + Mask)
	default:
		b.WriteString(u.EscapedPath())
	}
	if u.RawQuery != "" || u.ForceQuery {
		b.WriteString("?" + params(u.RawQuery, "&"))
	}
	if u.Fragment != "" {
		b.WriteString("#" + Mask)
	}
	return b.String()
}

// URLs is a comma-separated list of URLs, each shown as URL shows it.
func URLs(s string) string {
	var out []string
	for u := range strings.SplitSeq(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, URL(u))
		}
	}
	return strings.Join(out, ",")
}

// params replaces the value of every key=value of a query (or a DSN's
// parameters), separated by sep; a part without '=' is replaced whole.
func params(q, sep string) string {
	if q == "" {
		return ""
	}
	parts := strings.Split(q, sep)
	for i, p := range parts {
		if k, _, ok := strings.Cut(p, "="); ok {
			parts[i] = k + "=" + Mask
		} else if p != "" {
			parts[i] = Mask
		}
	}
	return strings.Join(parts, sep)
}

// DSN is a go-sql-driver DSN,
// [user[:password]@][net[(addr,addr...)]]/dbname[?param=value&...], with
// its password and every parameter value replaced by Mask. It splits the
// DSN where the driver does: the database after the last '/', the user
// before the last '@' ahead of it, the password after the user's first
// ':'. So a password holding '@', ':' or '/' is replaced whole, and every
// address of a list of hosts is kept.
func DSN(s string) string {
	head, tail := dsnParts(s)
	if at := strings.LastIndex(head, "@"); at >= 0 {
		if user, _, ok := strings.Cut(head[:at], ":"); ok {
			head = user + ":" + Mask + head[at:]
		}
	}
	if db, q, ok := strings.Cut(tail, "?"); ok {
		tail = db + "?" + params(q, "&")
	}
	return head + tail
}

// dsnParts splits a DSN at its last '/': what comes before (user,
// password, net and addresses) and the rest ("/dbname?params").
func dsnParts(s string) (head, tail string) {
	if slash := strings.LastIndex(s, "/"); slash >= 0 {
		return s[:slash], s[slash:]
	}
	return s, ""
}

// URLError is err with raw, and every part of it that may be a credential
// (userinfo, query values and keys without a value, the fragment), replaced
// in its message: an error from parsing or dialing a URL may quote any of
// them (url.Parse quotes the whole text; go-redis quotes an option's bad
// value). It finds the parts even when raw does not parse. errors.Is and
// errors.As still see err.
func URLError(err error, raw string) error {
	if err == nil || raw == "" {
		return err
	}
	return scrub(err, raw, URL(raw), urlSecrets(raw))
}

// DSNError is err with the DSN's password and parameter values replaced in
// its message (the driver quotes a bad parameter's value). errors.Is and
// errors.As still see err.
func DSNError(err error, dsn string) error {
	if err == nil || dsn == "" {
		return err
	}
	return scrub(err, dsn, DSN(dsn), dsnSecrets(dsn))
}

// minPart is the shortest part replaced in a message other than a
// password: shorter ones ("0", "on") are not credentials, and replacing
// them would garble every number in it.
const minPart = 4

func urlSecrets(raw string) []string {
	var out []string
	add := func(s string, min int) {
		if len(s) >= min {
			out = append(out, s)
			if un, err := url.QueryUnescape(s); err == nil && un != s {
				out = append(out, un)
			}
		}
	}
	if u, err := url.Parse(raw); err == nil {
		if u.User != nil {
			add(u.User.Username(), minPart)
			if p, ok := u.User.Password(); ok {
				add(p, 1)
			}
		}
		add(u.Fragment, minPart)
		add(u.Opaque, minPart)
		add(u.RawQuery, minPart)
	}
	// The same read by hand, for text url.Parse refuses: userinfo is what
	// comes before the last '@' (of the authority, or of the whole text
	// for a password holding '/'), the query what follows the first '?'.
	rest := raw
	if _, after, ok := strings.Cut(raw, "://"); ok {
		rest = after
	}
	auth := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		auth = rest[:i]
	}
	for _, s := range []string{auth, rest} {
		if at := strings.LastIndex(s, "@"); at >= 0 {
			user, pass, ok := strings.Cut(s[:at], ":")
			add(user, minPart)
			if ok {
				add(pass, 1)
			}
		}
	}
	if _, q, ok := strings.Cut(raw, "?"); ok {
		q, frag, _ := strings.Cut(q, "#")
		add(frag, minPart)
		for p := range strings.SplitSeq(q, "&") {
			k, v, ok := strings.Cut(p, "=")
			if !ok {
				v = k
			}
			add(v, minPart)
		}
	}
	return out
}

func dsnSecrets(dsn string) []string {
	var out []string
	head, tail := dsnParts(dsn)
	if at := strings.LastIndex(head, "@"); at >= 0 {
		if _, pass, ok := strings.Cut(head[:at], ":"); ok && pass != "" {
			out = append(out, pass)
		}
	}
	if _, q, ok := strings.Cut(tail, "?"); ok {
		for p := range strings.SplitSeq(q, "&") {
			_, v, _ := strings.Cut(p, "=")
			if len(v) >= minPart {
				out = append(out, v)
				if un, err := url.QueryUnescape(v); err == nil && un != v {
					out = append(out, un)
				}
			}
		}
	}
	return out
}

// scrub replaces raw (as it is and as %q writes it) by shown, then each of
// parts, longest first, by Mask, in err's message.
func scrub(err error, raw, shown string, parts []string) error {
	msg := err.Error()
	clean := strings.ReplaceAll(msg, raw, shown)
	if q := strconv.Quote(raw); len(q) > 2 {
		clean = strings.ReplaceAll(clean, q[1:len(q)-1], shown)
	}
	slices.SortFunc(parts, func(a, b string) int { return len(b) - len(a) })
	for _, p := range parts {
		clean = strings.ReplaceAll(clean, p, Mask)
		if q := strconv.Quote(p); len(q) > 2 {
			clean = strings.ReplaceAll(clean, q[1:len(q)-1], Mask)
		}
	}
	if clean == msg {
		return err
	}
	return &redacted{msg: clean, err: err}
}

// redacted is an error whose message had credentials replaced.
type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }

// Unwrap lets errors.Is and errors.As see the error; its own message is
// not to be logged.
func (e *redacted) Unwrap() error { return e.err }
