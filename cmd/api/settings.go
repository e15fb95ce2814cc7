package main

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"seckill/internal/ratelimit"
)

// setting is one row of the settings table: a variable of the environment,
// its default, the typed field of config it fills (which parses and checks
// the text) and one line of doc. Loading walks the table, "api serve
// --help" prints it, the start-up line logs it, and TestSettingsDoc holds
// the table of docs/operating.md against it.
type setting struct {
	name string
	// def is the default, as the documented table writes it; "" for none.
	def string
	// withDSN, when set, is the default once SECKILL_MYSQL_DSN names a
	// database server (def is the embedded mode's).
	withDSN string
	// unset says what an empty default means, such as "(embedded)".
	unset string
	doc   string
	// secret: never logged (only whether it is set), never trimmed.
	secret bool
	// show redacts the value for the log (passwords in URLs); nil: as is.
	show func(string) string
	// field is the typed field of c the value goes to.
	field func(c *config) value
}

// value is a typed config field: Set parses and checks the text, String
// gives it back for the log (flag.Value's shape).
type value interface {
	Set(s string) error
	String() string
}

// defaultFor is the default when SECKILL_MYSQL_DSN is set (server) or not.
func (s setting) defaultFor(server bool) string {
	if server && s.withDSN != "" {
		return s.withDSN
	}
	return s.def
}

// defaultCell is the default as the settings table of docs/operating.md
// writes it.
func (s setting) defaultCell() string {
	switch {
	case s.withDSN != "":
		return fmt.Sprintf("`%s` embedded, `%s` with `SECKILL_MYSQL_DSN`", s.def, s.withDSN)
	case s.def != "":
		return "`" + s.def + "`"
	case s.unset != "":
		return s.unset
	}
	return "(none)"
}

// settings is the whole table, in the order --help and docs/operating.md
// list it.
func settings() []setting {
	return slices.Concat(coreSettings, paySettings, webSettings)
}

// loadSettings fills c from getenv by walking rows; it returns one message
// per refused value, each naming its setting.
func loadSettings(rows []setting, getenv func(string) string, c *config) []string {
	server := strings.TrimSpace(getenv("SECKILL_MYSQL_DSN")) != ""
	var errs []string
	for _, s := range rows {
		v := getenv(s.name)
		if !s.secret {
			v = strings.TrimSpace(v)
		}
		if v == "" {
			v = s.defaultFor(server)
		}
		if err := s.field(c).Set(v); err != nil {
			errs = append(errs, s.name+" "+err.Error())
		}
	}
	return errs
}

// logAttrs is c as the table's rows, for the start-up line: durations as
// 15m0s, secrets only as set or not, passwords redacted.
func logAttrs(rows []setting, c *config) []slog.Attr {
	attrs := make([]slog.Attr, 0, len(rows))
	for _, s := range rows {
		key := strings.ToLower(strings.TrimPrefix(s.name, "SECKILL_"))
		v := s.field(c).String()
		switch {
		case s.secret:
			attrs = append(attrs, slog.Bool(key+"_set", v != ""))
			continue
		case s.show != nil:
			v = s.show(v)
		}
		attrs = append(attrs, slog.String(key, v))
	}
	return attrs
}

// printSettings writes the table for --help: name, default, doc.
func printSettings(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTING\tDEFAULT\tMEANING")
	for _, s := range settings() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.name, strings.ReplaceAll(s.defaultCell(), "`", ""), s.doc)
	}
	_ = tw.Flush()
}

// text is a string setting; check, when set, refuses bad values.
type text struct {
	p     *string
	check func(string) error
}

func (t text) Set(s string) error {
	*t.p = s
	if t.check == nil {
		return nil
	}
	return t.check(s)
}
func (t text) String() string { return *t.p }

// oneOf is a string setting with a fixed set of values.
type oneOf struct {
	p      *string
	values []string
}

func (o oneOf) Set(s string) error {
	*o.p = s
	if !slices.Contains(o.values, s) {
		return fmt.Errorf("must be %s or %s", strings.Join(o.values[:len(o.values)-1], ", "), o.values[len(o.values)-1])
	}
	return nil
}
func (o oneOf) String() string { return *o.p }

// integer is an int setting from lo to hi.
type integer struct {
	p      *int
	lo, hi int
}

func (n integer) Set(s string) error {
	v, err := strconv.Atoi(s)
	*n.p = v
	if err != nil || v < n.lo || v > n.hi {
		return fmt.Errorf("must be an integer from %d to %d", n.lo, n.hi)
	}
	return nil
}
func (n integer) String() string { return strconv.Itoa(*n.p) }

// duration is a time.Duration setting of at least lo and, when hi is set,
// at most hi; with off, "off" and "0" mean 0.
type duration struct {
	p      *time.Duration
	lo, hi time.Duration
	off    bool
}

func (d duration) Set(s string) error {
	if d.off && (s == "off" || s == "0") {
		*d.p = 0
		return nil
	}
	v, err := time.ParseDuration(s)
	*d.p = v
	if err == nil && v >= d.lo && (d.hi == 0 || v <= d.hi) {
		return nil
	}
	switch {
	case d.hi != 0 && d.off:
		return fmt.Errorf("must be a duration from %s to %s, such as 200ms, or off", d.lo, d.hi)
	case d.hi != 0:
		return fmt.Errorf("must be a duration from %s to %s", d.lo, d.hi)
	case d.lo > time.Nanosecond:
		return fmt.Errorf("must be a duration of at least %s", d.lo)
	}
	return fmt.Errorf("must be a positive duration such as 5s")
}

func (d duration) String() string {
	if d.off && *d.p == 0 {
		return "off"
	}
	return d.p.String()
}

// positive is a duration setting above zero.
func positive(p *time.Duration) duration { return duration{p: p, lo: time.Nanosecond} }

// onOff is a boolean setting written on or off.
type onOff struct{ p *bool }

func (o onOff) Set(s string) error {
	switch strings.ToLower(s) {
	case "on", "true", "1", "yes":
		*o.p = true
	case "off", "false", "0", "no":
		*o.p = false
	default:
		return fmt.Errorf("must be on or off")
	}
	return nil
}

func (o onOff) String() string {
	if *o.p {
		return "on"
	}
	return "off"
}

// rule is a rate-limit setting: N/duration or off.
type rule struct{ p *ratelimit.Rule }

func (r rule) Set(s string) error {
	v, err := ratelimit.ParseRule(s)
	*r.p = v
	if err != nil {
		return fmt.Errorf("is not a limit: %w", err)
	}
	return nil
}
func (r rule) String() string { return r.p.String() }

// list is a comma-separated setting; "none" is an empty list. check, when
// set, refuses a bad item.
type list struct {
	p     *[]string
	check func(string) error
}

func (l list) Set(s string) error {
	*l.p = nil
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" || f == "none" {
			continue
		}
		if l.check != nil {
			if err := l.check(f); err != nil {
				return err
			}
		}
		*l.p = append(*l.p, f)
	}
	return nil
}
func (l list) String() string { return strings.Join(*l.p, ",") }

// level is a log level setting.
type level struct{ p *slog.Level }

func (l level) Set(s string) error {
	if err := l.p.UnmarshalText([]byte(s)); err != nil {
		return fmt.Errorf("must be debug, info, warn or error")
	}
	return nil
}
func (l level) String() string { return strings.ToLower(l.p.String()) }
