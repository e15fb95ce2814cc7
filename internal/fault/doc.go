// Package fault holds the fault tests of the order pipeline: each starts
// real redis-server, mariadbd and service processes on loopback, sends a
// burst of purchases, injects a fault (a kill, a pause, a restart, a held
// lock, a poison message), lets it heal, waits for the pipeline to go
// quiet, and checks the invariants I1 to I7 of the reliability notes.
package fault
