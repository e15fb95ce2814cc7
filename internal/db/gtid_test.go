package db_test

import (
	"slices"
	"testing"

	"seckill/internal/db"
)

func TestParseGTIDs(t *testing.T) {
	h, err := db.ParseGTIDs(" 0-1-100,0-2-7, 1-1-3,0-1-90\n")
	if err != nil {
		t.Fatal(err)
	}
	want := db.History{{Domain: 0, Server: 1}: 100, {Domain: 0, Server: 2}: 7, {Domain: 1, Server: 1}: 3}
	if h.String() != want.String() || len(h) != len(want) {
		t.Fatalf("parsed %s; want %s", h, want)
	}
	if h, err := db.ParseGTIDs(""); err != nil || len(h) != 0 {
		t.Fatalf("empty list: %v, %v", h, err)
	}
	for _, bad := range []string{"0-1", "0-1-x", "a-1-2", "0-1-2-3", "-1-1-1", "0-4294967296-1"} {
		if _, err := db.ParseGTIDs(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestHistoryLacks: a promoted replica that received the old primary's
// transactions up to 995 of 1000 lacks 0-1-1000, however far its own
// writes (server 2) go past 1000 in the domain; one that received them all
// lacks nothing.
func TestHistoryLacks(t *testing.T) {
	seen := db.History{{Domain: 0, Server: 1}: 1000, {Domain: 0, Server: 3}: 12}
	cases := []struct {
		name string
		now  string
		want []db.GTID
	}{
		{"caught up", "0-1-1000,0-3-12", nil},
		{"ahead", "0-1-1004,0-3-12,0-2-5", nil},
		{"behind, its own writes past the old primary's", "0-1-995,0-3-12,0-2-1100", []db.GTID{{0, 1, 1000}}},
		{"an origin missing", "0-1-1000", []db.GTID{{0, 3, 12}}},
		{"empty", "", []db.GTID{{0, 1, 1000}, {0, 3, 12}}},
	}
	for _, c := range cases {
		now, err := db.ParseGTIDs(c.now)
		if err != nil {
			t.Fatal(err)
		}
		if got := now.Lacks(seen); !slices.Equal(got, c.want) {
			t.Errorf("%s: %s lacks %v; want %v", c.name, c.now, got, c.want)
		}
	}
}

func TestSplitHostsDSN(t *testing.T) {
	cases := []struct{ dsn, addr string }{
		{"u:p@tcp(a:1,b:2)/db?parseTime=true", "a:1,b:2"},
		{"u:p@tcp(a:1, b)/db", "a:1,b:3306"},
		{"u:p@tcp(a:1)/db", "a:1"},
		{"u:p(x,y)@tcp(a:1,b:2)/db", "a:1,b:2"},
	}
	for _, c := range cases {
		mc, err := db.ParseDSN(c.dsn)
		if err != nil {
			t.Fatalf("%s: %v", c.dsn, err)
		}
		if mc.Addr != c.addr {
			t.Errorf("%s: addr %q; want %q", c.dsn, mc.Addr, c.addr)
		}
	}
	if _, err := db.ParseDSN("u:p@unix(/a,/b)/db"); err == nil {
		t.Error("several unix sockets accepted")
	}
}
