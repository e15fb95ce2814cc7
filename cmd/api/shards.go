package main

import (
	"cmp"
	"context"
	"fmt"
)

// shardsCommand runs "api shards": where each shard of the sale lives, as
// JSON: each shard's hash tag, slot and the master serving it.
func shardsCommand(ctx context.Context, e *cmdEnv) error {
	if e.cfg.embeddedRedis() {
		return fmt.Errorf("set SECKILL_REDIS_URL to the service's Redis; the embedded Redis holds every shard in the service's own process")
	}
	rdb, closeRedis, err := openRedis(ctx, e.cfg, e.log)
	if err != nil {
		return err
	}
	defer closeRedis()
	places, err := saleKeys(e.cfg, rdb).Placement(ctx, rdb)
	if err != nil {
		return err
	}
	type shard struct {
		Shard  int    `json:"shard"`
		Tag    string `json:"tag"`
		Slot   int    `json:"slot"`
		Master string `json:"master"`
	}
	out := make([]shard, 0, len(places))
	masters := map[string]bool{}
	for _, p := range places {
		master := cmp.Or(p.Master, "(unknown)")
		masters[master] = true
		out = append(out, shard{Shard: p.Shard, Tag: p.Tag, Slot: p.Slot, Master: master})
	}
	return printJSON(e.stdout, map[string]any{"shards": out, "masters": len(masters)})
}
