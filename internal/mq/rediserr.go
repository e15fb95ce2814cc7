package mq

import "github.com/redis/go-redis/v9"

// IsNoGroup reports whether err, or an error it wraps, is Redis's NOGROUP
// answer: the stream or its consumer group does not exist (nothing created
// it yet, or Redis lost its data). A script whose call raises it passes the
// code on at the start of its error.
func IsNoGroup(err error) bool { return redis.HasErrorPrefix(err, "NOGROUP") }

// IsNoStream reports whether err, or an error it wraps, is Redis's answer
// to XINFO on a stream that does not exist, "ERR no such key". The
// message, not the generic ERR code, says so: go-redis's prefix check reads
// past "ERR ".
func IsNoStream(err error) bool { return redis.HasErrorPrefix(err, "no such key") }

// isBusyGroup reports whether err is Redis's answer to creating a consumer
// group that exists already.
func isBusyGroup(err error) bool { return redis.HasErrorPrefix(err, "BUSYGROUP") }
