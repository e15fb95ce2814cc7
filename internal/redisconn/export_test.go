package redisconn

import "time"

// SetCountsClock replaces rc's clock.
func SetCountsClock(rc *ReplicaCounts, now func() time.Time) { rc.now = now }
