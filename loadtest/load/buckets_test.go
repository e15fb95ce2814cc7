package load

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"seckill/internal/auth"
	"seckill/internal/voucher"
)

// TestBuyerIDsSkew: with a skew, that share of the buyers has home bucket
// 0, in every prefix of the list; the rest have another home, spread over
// the other buckets; the ids are distinct and the same every time.
// Without a skew, or with one bucket, the buyers are consecutive ids.
func TestBuyerIDsSkew(t *testing.T) {
	t.Parallel()
	const base, n, nb, skew = 100_000, 3000, 3, 0.8
	ids := buyerIDs(base, n, skew, nb)
	seen := map[int64]bool{}
	homes := make([]int, nb)
	for i, id := range ids {
		if id < base || seen[id] {
			t.Fatalf("buyer %d: id %d below the base or taken twice", i, id)
		}
		seen[id] = true
		homes[voucher.Home(id, nb)]++
		if want := int(math.Round(skew * float64(i+1))); homes[0] != want {
			t.Fatalf("the first %d buyers: %d at home in bucket 0, want %d", i+1, homes[0], want)
		}
	}
	if homes[0] != 2400 || homes[1]+homes[2] != 600 || homes[1] < 240 || homes[2] < 240 {
		t.Fatalf("homes %v of %d buyers, want 2400 in bucket 0 and the rest spread over 1 and 2", homes, n)
	}
	if !slices.Equal(ids, buyerIDs(base, n, skew, nb)) {
		t.Fatal("buyerIDs is not deterministic")
	}
	for _, c := range []struct {
		skew float64
		nb   int
	}{{0, 3}, {0.8, 1}} {
		ids := buyerIDs(base, 50, c.skew, c.nb)
		for i, id := range ids {
			if id != base+int64(i) {
				t.Fatalf("skew %v of %d buckets: buyer %d is %d, want consecutive ids", c.skew, c.nb, i, id)
			}
		}
	}
	all := buyerIDs(base, 100, 1, nb)
	if slices.ContainsFunc(all, func(id int64) bool { return voucher.Home(id, nb) != 0 }) {
		t.Fatal("skew 1: a buyer not at home in bucket 0")
	}
}

func TestParseBuckets(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in    string
		nb    int
		ok    bool
		field any
	}{{"1", 1, true, nil}, {"3", 3, true, 3}, {"auto", 0, true, "auto"}, {"0", 0, false, nil}, {"-2", 0, false, nil}, {"x", 0, false, nil}} {
		nb, err := ParseBuckets(c.in)
		if nb != c.nb || (err == nil) != c.ok {
			t.Errorf("ParseBuckets(%q) = %d, %v", c.in, nb, err)
		}
		if c.ok && bucketsField(c.in) != c.field {
			t.Errorf("bucketsField(%q) = %v, want %v", c.in, bucketsField(c.in), c.field)
		}
	}
}

// TestTailOf on a synthetic sale of 200 units: the time from the first
// sold_out to the last sale, and the latency of the purchases that won
// the last 1% of the units (the last 2 accepted, by when they came, not by
// their place in the list).
func TestTailOf(t *testing.T) {
	t.Parallel()
	at := func(ms int) time.Duration { return time.Duration(ms) * time.Millisecond }
	var answers []answer
	for i := range 198 {
		answers = append(answers, answer{at: at(10 + i), latency: at(1)})
	}
	answers = append(answers,
		answer{at: at(1500), latency: at(40)}, // the last sale
		answer{at: at(1000), soldOut: true, latency: at(2)},
		answer{at: at(1200), latency: at(20)},
		answer{at: at(1100), soldOut: true, latency: at(3)},
		answer{at: at(1600), soldOut: true, latency: at(3)},
	)
	tail := tailOf(answers)
	if tail == nil {
		t.Fatal("no tail")
	}
	want := Tail{SoldOuts: 3, FirstSoldOut: 1, LastSale: 1.5, SoldOutToLastSale: 500, LastUnits: 2}
	got := *tail
	got.Latency = Latency{}
	if got != want {
		t.Fatalf("tail %+v, want %+v", got, want)
	}
	if tail.Latency.P50 != 20 || tail.Latency.P99 != 40 {
		t.Fatalf("last 1%% latency %+v, want p50 20 ms, p99 40 ms", tail.Latency)
	}

	// A sold_out only after the last sale: negative. None: 0. Fewer than
	// 100 sales: the last one alone. No sale: no tail.
	tail = tailOf([]answer{{at: at(5), latency: at(7)}, {at: at(2), latency: at(9)}, {at: at(30), soldOut: true}})
	if tail.SoldOutToLastSale != -25 || tail.LastUnits != 1 || tail.Latency.P99 != 7 {
		t.Fatalf("sold_out after the last sale: %+v", tail)
	}
	if tail = tailOf([]answer{{at: at(5)}}); tail.SoldOuts != 0 || tail.SoldOutToLastSale != 0 || tail.FirstSoldOut != 0 {
		t.Fatalf("no sold_out: %+v", tail)
	}
	if tail = tailOf([]answer{{at: at(5), soldOut: true}}); tail != nil {
		t.Fatalf("no sale: %+v", tail)
	}
}

// TestRunSendsBuckets: the voucher's creation body carries "buckets" only
// when it is not 1 (a service without buckets sees the request it knows),
// as a number or "auto"; with a skew the buyers sent are the share asked
// at home in bucket 0, each with a token of its own user id; the summary
// carries the bucket count asked, the count the service made (auto
// resolved) and the tail.
func TestRunSendsBuckets(t *testing.T) {
	t.Parallel()
	signer, err := auth.NewSigner([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		buckets string
		skew    float64
		field   string // the "buckets" value in the body as JSON, "" for none
		made    int    // what the creation answer names
	}{{"", 0, "", 1}, {"1", 0, "", 1}, {"3", 0.8, "3", 3}, {"auto", 0, `"auto"`, 3}} {
		var mu sync.Mutex
		var bodies []map[string]json.RawMessage
		users := map[int64]bool{}
		var bad []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if r.URL.Path == "/api/v1/vouchers" {
				var body map[string]json.RawMessage
				if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
					bad = append(bad, err.Error())
				}
				bodies = append(bodies, body)
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"voucher":{"id":7,"buckets":%d},"redis_ready":true}`, c.made)
				return
			}
			user, _ := strconv.ParseInt(r.Header.Get("X-Loadtest-User"), 10, 64)
			id, err := signer.Parse(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
			if (err != nil || id.UserID != user) && len(bad) < 5 {
				bad = append(bad, fmt.Sprintf("user %d sent a token of %d (%v)", user, id.UserID, err))
			}
			users[user] = true
			if len(users) > 100 {
				w.WriteHeader(http.StatusConflict)
				fmt.Fprint(w, `{"code":"sold_out"}`)
				return
			}
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprintf(w, `{"order_id":"%d","status":"pending"}`, user)
		}))
		res, err := Run(context.Background(), Config{URL: srv.URL, Buckets: c.buckets, Skew: c.skew, Stock: 100, Users: 500,
			Concurrency: 4, Secret: testSecret, Progress: -1})
		srv.Close()
		if err != nil {
			t.Fatalf("buckets %q: %v", c.buckets, err)
		}
		if len(bad) > 0 {
			t.Fatalf("buckets %q: %v", c.buckets, bad)
		}
		got, has := bodies[0]["buckets"]
		if len(bodies) != 1 || has != (c.field != "") || string(got) != c.field {
			t.Errorf("buckets %q: creation body %v, want buckets %s", c.buckets, bodies, c.field)
		}
		s := res.Summary
		if want := cmp.Or(c.buckets, "1"); s.Buckets != want || s.BucketsMade != c.made {
			t.Errorf("buckets %q: summary says %q asked, %d made; want %d made", c.buckets, s.Buckets, s.BucketsMade, c.made)
		}
		if s.Tail == nil || s.Tail.SoldOuts != 400 || s.Tail.LastUnits != 1 {
			t.Errorf("buckets %q: tail %+v, want 400 sold_out and the last of 100 sales", c.buckets, s.Tail)
		}
		if c.skew > 0 {
			home0 := 0
			for u := range users {
				if voucher.Home(u, 3) == 0 {
					home0++
				}
			}
			if len(users) != 500 || home0 != 400 || s.HomeZero != 400 {
				t.Errorf("skew %v: %d buyers sent, %d at home in bucket 0 (summary: %d), want 400 of 500", c.skew, len(users), home0, s.HomeZero)
			}
		}
	}
	var note strings.Builder
	if err := madeBuckets(Config{Buckets: "3", Log: &note}, 7, nil); err != nil || !strings.Contains(note.String(), "does not say its buckets") {
		t.Errorf("no buckets in the answer: %v, note %q", err, note.String())
	}
	three, one := 3, 1
	if err := madeBuckets(Config{Buckets: "3"}, 7, &one); err == nil {
		t.Error("3 buckets asked, 1 made: no error")
	}
	for _, c := range []struct {
		asked string
		made  *int
	}{{"3", &three}, {"auto", &three}, {"1", &one}, {"1", nil}} {
		if err := madeBuckets(Config{Buckets: c.asked, Log: &note}, 7, c.made); err != nil {
			t.Errorf("%s asked, %v made: %v", c.asked, c.made, err)
		}
	}
	for _, c := range []Config{{Buckets: "auto", Skew: 0.5}, {Buckets: "3", Skew: 1.5}, {Buckets: "0"}} {
		c.URL, c.Secret = "http://127.0.0.1:1", testSecret
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("buckets %q, skew %v: no error", c.Buckets, c.Skew)
		}
	}
}

// TestSummaryInWords: the summary a person reads says the bucket count
// the service made (auto resolved; the count given when its answer named
// none) and names what the tail measured in words, not by its JSON field;
// the JSON keeps the field names scripts read.
func TestSummaryInWords(t *testing.T) {
	t.Parallel()
	text := func(s Summary) string {
		var b strings.Builder
		s.Print(&b)
		return b.String()
	}
	refused := &Tail{SoldOuts: 3, FirstSoldOut: 1, LastSale: 1.5, SoldOutToLastSale: 500, LastUnits: 2}
	for _, c := range []struct {
		s    Summary
		want []string
	}{
		{Summary{Buckets: "auto", BucketsMade: 3, Tail: refused}, []string{"(3 buckets, auto)",
			"first of 3 sold_out answers at 1.000s", "time from the first sold_out answer to the last sale 500.0 ms: buyers were refused while units still sold"}},
		{Summary{Buckets: "1", BucketsMade: 1, Tail: &Tail{SoldOuts: 1, FirstSoldOut: 0.03, LastSale: 0.005, SoldOutToLastSale: -25, LastUnits: 1}},
			[]string{"(1 bucket)", "the first sold_out answer came 25.0 ms after the last sale: no buyer was refused"}},
		{Summary{Buckets: "3", Tail: &Tail{SoldOuts: 1, FirstSoldOut: 0.005, LastSale: 0.005, LastUnits: 1}},
			[]string{"(buckets 3, not confirmed by the service)", "came 0.0 ms after the last sale"}},
		{Summary{Tail: &Tail{LastSale: 0.005, LastUnits: 1}}, []string{"(buckets 1, not confirmed by the service)", "no sold_out answer"}},
	} {
		got := text(c.s)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("summary lacks %q:\n%s", w, got)
			}
		}
		if strings.Contains(got, "sold_out_to_last_sale") || strings.Contains(got, "-0.0") {
			t.Errorf("summary names the JSON field or prints -0.0:\n%s", got)
		}
	}
	b, err := json.Marshal(Summary{Buckets: "auto", BucketsMade: 3, Tail: refused})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"buckets":"auto"`, `"buckets_made":3`, `"sold_out_to_last_sale_ms":500`, `"first_sold_out_s":1`, `"last_sale_s":1.5`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("JSON summary lacks %s: %s", key, b)
		}
	}
}

const testSecret = "0123456789abcdef0123456789abcdef"
