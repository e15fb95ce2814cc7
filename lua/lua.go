// Package lua holds the project's Redis scripts, one file per script, each
// with a header that documents its KEYS, ARGV and return values.
package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed purchase.lua
	purchaseSrc string
	//go:embed load.lua
	loadSrc string
	//go:embed ack.lua
	ackSrc string
)

// Purchase checks a buyer's eligibility, reserves stock and queues the order.
// go-redis runs it with EVALSHA and falls back to EVAL on NOSCRIPT.
func Purchase() *redis.Script { return redis.NewScript(purchaseSrc) }

// Load writes a voucher's sale state when it is missing.
func Load() *redis.Script { return redis.NewScript(loadSrc) }

// Ack acknowledges and deletes stream entries of a consumer group.
func Ack() *redis.Script { return redis.NewScript(ackSrc) }
