//go:build !linux

package testenv

import "syscall"

// sysProcAttr puts a server in its own process group; outside Linux there is
// no parent-death signal, so only Main's clean-up stops it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
