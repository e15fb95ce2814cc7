// Package proc reads what the load generator measures of other processes
// from Linux's /proc: the CPU time a process has used (utime + stime of
// /proc/<pid>/stat), the kernel's clock tick those are counted in, and which
// process listens on a loopback port (/proc/net/tcp, tcp6 and
// /proc/<pid>/fd). It reads, never signals or changes, a process.
package proc

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unsafe"
)

// Ticks is the CPU time pid has used so far, user and system, summed over
// its threads, in clock ticks (ClockTick per second).
func Ticks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	u, s, err := parseStat(b)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return u + s, nil
}

// parseStat reads utime and stime, fields 14 and 15 of proc(5)'s stat line.
// Field 2, the command name in parentheses, may itself hold spaces and
// parentheses, so the fields are counted from the last ')': state is the
// first field after it, utime the twelfth.
func parseStat(b []byte) (utime, stime uint64, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("no ')' closing the command name")
	}
	f := strings.Fields(string(b[i+1:]))
	const utimeAt = 14 - 3 // fields 1 and 2 come before the ')', state (3) is f[0]
	if len(f) <= utimeAt+1 {
		return 0, 0, fmt.Errorf("%d fields after the command name, want at least %d", len(f), utimeAt+2)
	}
	if utime, err = strconv.ParseUint(f[utimeAt], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("utime: %w", err)
	}
	if stime, err = strconv.ParseUint(f[utimeAt+1], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("stime: %w", err)
	}
	return utime, stime, nil
}

// atClkTck is the auxiliary vector's entry for the clock tick (AT_CLKTCK,
// <linux/auxvec.h>): what sysconf(_SC_CLK_TCK) returns in C.
const atClkTck = 17

// ClockTick is the number of clock ticks a second in which /proc reports
// CPU times (USER_HZ). Go has no sysconf without cgo, so it is read where
// the C library reads it: the kernel hands it to every process in the
// auxiliary vector (/proc/self/auxv).
func ClockTick() (int64, error) {
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return 0, err
	}
	hz, ok := parseAuxv(b, int(unsafe.Sizeof(uintptr(0))))
	if !ok || hz == 0 {
		return 0, errors.New("/proc/self/auxv holds no AT_CLKTCK")
	}
	return int64(hz), nil
}

// parseAuxv finds AT_CLKTCK in an auxiliary vector: pairs of native words
// (type, value), ended by type 0.
func parseAuxv(b []byte, word int) (uint64, bool) {
	read := func(p []byte) uint64 {
		if word == 4 {
			return uint64(binary.NativeEndian.Uint32(p))
		}
		return binary.NativeEndian.Uint64(p)
	}
	for len(b) >= 2*word {
		typ, val := read(b[:word]), read(b[word:2*word])
		b = b[2*word:]
		switch typ {
		case 0:
			return 0, false
		case atClkTck:
			return val, true
		}
	}
	return 0, false
}

// Listeners returns the pids of the processes holding a listening TCP
// socket on port at a loopback or wildcard address (127.0.0.0/8, ::1,
// 0.0.0.0, ::): the server a loopback URL reaches. Several processes share
// one socket when a server forks its workers (nginx); processes of other
// users, whose descriptors cannot be read, are not found.
func Listeners(port int) ([]int, error) {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // no IPv6
			}
			return nil, err
		}
		for _, ino := range listening(b, port) {
			inodes["socket:["+ino+"]"] = true
		}
	}
	if len(inodes) == 0 {
		return nil, nil
	}
	return socketOwners(inodes)
}

// listening returns the inodes of the sockets of a /proc/net/tcp or tcp6
// table that listen on port at a loopback or wildcard address.
func listening(table []byte, port int) []string {
	var out []string
	for line := range strings.SplitSeq(string(table), "\n") {
		f := strings.Fields(line)
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
		if len(f) < 10 || f[3] != "0A" { // 0A: TCP_LISTEN
			continue
		}
		ip, p, ok := parseAddr(f[1])
		if !ok || p != port || !(ip.IsLoopback() || ip.IsUnspecified()) {
			continue
		}
		out = append(out, f[9])
	}
	return out
}

// parseAddr reads a table's "ADDR:PORT": the address is 4 or 16 bytes
// printed as 32-bit words in the machine's byte order, the port in hex.
func parseAddr(s string) (net.IP, int, bool) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return nil, 0, false
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return nil, 0, false
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return nil, 0, false
	}
	ip := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(ip[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	return ip, int(port), true
}

// socketOwners returns the pids with a descriptor on one of the sockets
// (readlink of /proc/<pid>/fd/N is "socket:[inode]"), in order.
func socketOwners(sockets map[string]bool) ([]int, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*/fd")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(d)
		if err != nil {
			continue // another user's process, or gone
		}
		for _, fd := range fds {
			if link, err := os.Readlink(filepath.Join(d, fd.Name())); err == nil && sockets[link] {
				pids = append(pids, pid)
				break
			}
		}
	}
	slices.Sort(pids)
	return pids, nil
}
