package db

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// GTID is one of MariaDB's global transaction ids: the replication domain,
// the server_id of the server that committed it first, and its sequence
// number in the domain.
type GTID struct {
	Domain, Server uint32
	Seq            uint64
}

func (g GTID) String() string { return fmt.Sprintf("%d-%d-%d", g.Domain, g.Server, g.Seq) }

// Origin is a GTID's domain and originating server: the pair whose
// sequence numbers only grow, whichever server holds them now.
type Origin struct{ Domain, Server uint32 }

func (o Origin) String() string { return fmt.Sprintf("%d-%d", o.Domain, o.Server) }

// History is how far a database's history reaches, per origin: the
// highest sequence number of each (domain, server_id) whose transactions
// it holds. A replica promoted after a failover holds the old primary's
// transactions up to where it had received them: its History for the old
// primary's origin is lower than the old primary's own, and that gap is
// what the failover lost. A new primary's own writes come under its own
// server_id, so they never hide the gap.
type History map[Origin]uint64

// ParseGTIDs reads a comma-separated GTID list (@@gtid_binlog_state,
// @@gtid_slave_pos, @@last_gtid) into the highest sequence number per
// origin. Blanks are allowed around each GTID; an empty list is an empty
// History.
func ParseGTIDs(s string) (History, error) {
	h := History{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		g, err := ParseGTID(part)
		if err != nil {
			return nil, err
		}
		h.Add(g)
	}
	return h, nil
}

// ParseGTID reads one GTID, "domain-server-seq".
func ParseGTID(s string) (GTID, error) {
	f := strings.Split(strings.TrimSpace(s), "-")
	if len(f) != 3 {
		return GTID{}, fmt.Errorf("gtid %q: want domain-server-sequence", s)
	}
	d, err1 := strconv.ParseUint(f[0], 10, 32)
	sv, err2 := strconv.ParseUint(f[1], 10, 32)
	q, err3 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return GTID{}, fmt.Errorf("gtid %q: want three unsigned integers", s)
	}
	return GTID{Domain: uint32(d), Server: uint32(sv), Seq: q}, nil
}

// Add takes g into h: h then reaches at least g.
func (h History) Add(g GTID) {
	o := Origin{g.Domain, g.Server}
	if g.Seq > h[o] {
		h[o] = g.Seq
	}
}

// Merge takes every GTID of other into h.
func (h History) Merge(other History) {
	for o, seq := range other {
		h.Add(GTID{o.Domain, o.Server, seq})
	}
}

// Lacks lists the GTIDs of seen that h does not reach: for each origin,
// seen's highest transaction when h holds fewer of that origin's (none
// counts as fewer). Empty when h holds everything seen names. Sorted.
func (h History) Lacks(seen History) []GTID {
	var out []GTID
	for o, seq := range seen {
		if h[o] < seq {
			out = append(out, GTID{o.Domain, o.Server, seq})
		}
	}
	slices.SortFunc(out, func(a, b GTID) int {
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Server, b.Server))
	})
	return out
}

// String spells h as MariaDB does: GTIDs separated by commas, by domain
// then server.
func (h History) String() string {
	origins := slices.SortedFunc(maps.Keys(h), func(a, b Origin) int {
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Server, b.Server))
	})
	parts := make([]string, len(origins))
	for i, o := range origins {
		parts[i] = GTID{o.Domain, o.Server, h[o]}.String()
	}
	return strings.Join(parts, ",")
}
