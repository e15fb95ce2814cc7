package testenv

import "syscall"

// sysProcAttr puts a server in its own process group and has the kernel kill
// it when the test binary dies without running Main's clean-up (a panic, a
// test timeout), so no server outlives its test run.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
