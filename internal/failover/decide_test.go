package failover

import (
	"testing"

	"seckill/internal/db"
	"seckill/internal/order"
	"seckill/internal/voucher"
)

// TestDecideOrder enumerates decideOrder's table: every combination of
// what Redis and the database hold of an order Redis holds.
func TestDecideOrder(t *testing.T) {
	for _, c := range []struct {
		pending, written, lettered, otherLive bool
		want                                  orderFate
	}{
		{false, false, false, false, orderRequeue},
		{true, false, false, false, orderPending},
		{true, true, false, false, orderPending},
		{true, false, true, true, orderPending},
		{false, true, false, false, orderWritten},
		{false, true, true, true, orderWritten},
		{false, false, true, false, orderLettered},
		{false, false, true, true, orderLettered},
		{false, false, false, true, orderConflict},
	} {
		if got := decideOrder(c.pending, c.written, c.lettered, c.otherLive); got != c.want {
			t.Errorf("pending %v written %v lettered %v other live %v: %v, want %v", c.pending, c.written, c.lettered, c.otherLive, got, c.want)
		}
	}
}

// TestDecideEnd enumerates decideEnd's table: every state the database
// may hold an order in (or none), against every end Redis records.
func TestDecideEnd(t *testing.T) {
	hows := []string{voucher.EndedCancelled, voucher.EndedExpired, voucher.EndedRefunded}
	want := map[string][3]endFate{ // by database state, then cancelled, expired, refunded
		"":                          {endGone, endGone, endGone},
		order.StatusCancelled:       {endHeld, endHeld, endHeld},
		order.StatusRefunded:        {endHeld, endHeld, endHeld},
		order.StatusAwaitingPayment: {endCancel, endExpire, endCancel},
		order.StatusPaid:            {endConflict, endConflict, endRefund},
		order.StatusUsed:            {endConflict, endConflict, endConflict},
	}
	for status, fates := range want {
		for i, how := range hows {
			if got := decideEnd(status != "", status, how); got != fates[i] {
				t.Errorf("database %q, redis %s: %v, want %v", status, how, got, fates[i])
			}
		}
	}
	if len(want)-1 != len(order.States) {
		t.Fatalf("the table covers %d states; the lifecycle has %d", len(want)-1, len(order.States))
	}
}

// TestJudge enumerates judge's table: a shard's record of the database
// against the server reached.
func TestJudge(t *testing.T) {
	server := db.Server{Name: "db2:3306", ID: 2, History: db.History{{Domain: 0, Server: 1}: 995, {Domain: 0, Server: 2}: 1100}}
	galera := db.Server{Name: "n2:3306", ID: 1, Galera: true, GaleraCluster: "c1", GaleraReady: true, History: db.History{}}
	rec := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, c := range []struct {
		name string
		rec  map[string]string
		s    db.Server
		want verdict
	}{
		{"unreadable", nil, server, recordUnread},
		{"empty", rec(), server, recordHeld},
		{"held, same server", rec("lineage", "L", "server", server.Identity(), "g:0-1", "990", "g:0-2", "1100"), server, recordHeld},
		{"held, no server yet", rec("lineage", "L", "g:0-1", "995"), server, recordHeld},
		{"another lineage", rec("lineage", "R", "g:0-1", "1000"), server, recordRestored},
		{"lacks a commit", rec("lineage", "L", "g:0-1", "1000"), server, recordLost},
		{"lacks a commit, no lineage yet", rec("g:0-1", "1000"), server, recordLost},
		{"holds none of an origin", rec("lineage", "L", "g:0-3", "7"), server, recordForeign},
		{"another server, holds all", rec("lineage", "L", "server", "db1:3306 (server_id 1)", "g:0-1", "995"), server, recordMoved},
		{"galera, another node", rec("lineage", "L", "server", "galera cluster c1", "g:0-1", "50"), galera, recordHeld},
		{"galera, another cluster", rec("lineage", "L", "server", "galera cluster c0"), galera, recordMoved},
	} {
		if got, _ := judge(c.rec, c.s, "L"); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
