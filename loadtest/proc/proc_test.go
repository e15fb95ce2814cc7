package proc

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestParseStat: the command name may hold spaces and parentheses; the
// fields are counted after the last ')'.
func TestParseStat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, line   string
		utime, stime uint64
	}{
		{"plain", "4242 (redis-server) S 1 4242 4242 0 -1 4194560 1059 0 0 0 731 265 0 0 20 0 5 0 98 10 2 18446744073709551615 0 0 0 0 0 0 0 4096 17987 0 0 0 17 1 0 0 0 0 0", 731, 265},
		{"spaces and parentheses", "77 (a b) (c) x) R 1 77 77 0 -1 0 0 0 0 0 12 3 0 0 20 0 1 0 5 0 0", 12, 3},
		{"name ending in a digit field look-alike", "9 (1 2 3 4 5 6 7 8 9 10 11 12) S 1 9 9 0 -1 0 0 0 0 0 40 2 0 0 20 0 1 0 5 0 0\n", 40, 2},
	} {
		u, s, err := parseStat([]byte(tc.line))
		if err != nil || u != tc.utime || s != tc.stime {
			t.Errorf("%s: utime %d stime %d, %v; want %d %d", tc.name, u, s, err, tc.utime, tc.stime)
		}
	}
	for _, bad := range []string{"", "1 (x S 1 2", "1 (x) S 1 2 3", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 u 3 0"} {
		if _, _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

// TestTicksOfThisProcess: the process's own CPU time grows while it works.
func TestTicksOfThisProcess(t *testing.T) {
	t.Parallel()
	before, err := Ticks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	for {
		for i := range 1_000_000 {
			x += i
		}
		now, err := Ticks(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tick counted in 10 s of work (%d)", x)
		}
	}
	if _, err := Ticks(-1); err == nil {
		t.Error("Ticks(-1): no error")
	}
}

// TestClockTick: the auxiliary vector's clock tick is what getconf
// (sysconf in C) says.
func TestClockTick(t *testing.T) {
	t.Parallel()
	hz, err := ClockTick()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err != nil {
		if hz != 100 {
			t.Fatalf("clock tick %d; no getconf to compare with", hz)
		}
		t.Skipf("no getconf: %v", err)
	}
	if want, _ := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); hz != want {
		t.Fatalf("clock tick %d, getconf CLK_TCK %d", hz, want)
	}
}

func TestParseAuxv(t *testing.T) {
	t.Parallel()
	vec := func(word int, pairs ...uint64) []byte {
		var b []byte
		for _, v := range pairs {
			if word == 4 {
				b = binary.NativeEndian.AppendUint32(b, uint32(v))
			} else {
				b = binary.NativeEndian.AppendUint64(b, v)
			}
		}
		return b
	}
	for _, word := range []int{4, 8} {
		if hz, ok := parseAuxv(vec(word, 6, 4096, atClkTck, 250, 0, 0), word); !ok || hz != 250 {
			t.Errorf("word %d: %d %v; want 250", word, hz, ok)
		}
		if _, ok := parseAuxv(vec(word, 6, 4096, 0, 0, atClkTck, 250), word); ok {
			t.Errorf("word %d: an entry after the end was read", word)
		}
		if _, ok := parseAuxv(vec(word, 6, 4096)[:word+1], word); ok {
			t.Errorf("word %d: a cut vector was read", word)
		}
	}
}

// TestListening reads a table as the kernel prints it: loopback and
// wildcard listeners on the port are found, others are not.
func TestListening(t *testing.T) {
	t.Parallel()
	addr := func(ip net.IP, port int) string {
		var s string
		for i := 0; i < len(ip); i += 4 {
			s += fmt.Sprintf("%08X", binary.NativeEndian.Uint32(ip[i:]))
		}
		return fmt.Sprintf("%s:%04X", s, port)
	}
	row := func(local, st, inode string) string {
		return "   0: " + local + " 00000000:0000 " + st + " 00000000:00000000 00:00000000 00000000  1000        0 " + inode + " 1 0000000000000000 100 0 0 10 0"
	}
	v4 := func(s string) net.IP { return net.ParseIP(s).To4() }
	table := strings.Join([]string{
		"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
		row(addr(v4("127.0.0.1"), 18090), "0A", "101"),
		row(addr(v4("127.0.0.2"), 18090), "0A", "102"),
		row(addr(v4("0.0.0.0"), 18090), "0A", "103"),
		row(addr(v4("10.1.2.3"), 18090), "0A", "104"),     // not loopback
		row(addr(v4("127.0.0.1"), 18091), "0A", "105"),    // another port
		row(addr(v4("127.0.0.1"), 18090), "01", "106"),    // established, not listening
		row(addr(net.ParseIP("::1"), 18090), "0A", "107"), // tcp6
		row(addr(net.ParseIP("::"), 18090), "0A", "108"),
		row(addr(net.ParseIP("fe80::1"), 18090), "0A", "109"),
	}, "\n") + "\n"
	if got, want := listening([]byte(table), 18090), []string{"101", "102", "103", "107", "108"}; !slices.Equal(got, want) {
		t.Fatalf("listening on 18090: %v, want %v\n%s", got, want, table)
	}
	if ip, port, ok := parseAddr("0100007F:46AA"); !ok || !ip.Equal(net.IPv4(127, 0, 0, 1)) || port != 18090 {
		t.Fatalf("0100007F:46AA read as %v %d %v", ip, port, ok)
	}
}

// TestListenersFindsThisProcess: a socket this process listens on is found
// from its port; a port nobody listens on finds nobody.
func TestListenersFindsThisProcess(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	pids, err := Listeners(port)
	if err != nil || !slices.Equal(pids, []int{os.Getpid()}) {
		t.Fatalf("listeners of port %d: %v, %v; want [%d]", port, pids, err, os.Getpid())
	}
	ln.Close()
	if pids, err := Listeners(port); err != nil || len(pids) != 0 {
		t.Fatalf("listeners of closed port %d: %v, %v", port, pids, err)
	}
}
