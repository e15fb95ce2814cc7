package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
)

// shardsCommand runs "api shards": where each shard of the sale lives,
// one line per shard: shard, hash tag, slot, the master serving it.
func shardsCommand(ctx context.Context, cfg config, log *slog.Logger, stdout io.Writer) error {
	if cfg.embeddedRedis() {
		return fmt.Errorf("set SECKILL_REDIS_URL to the service's Redis; the embedded Redis holds every shard in the service's own process")
	}
	rdb, closeRedis, err := openRedis(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeRedis()
	places, err := saleKeys(cfg, rdb).Placement(ctx, rdb)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SHARD\tTAG\tSLOT\tMASTER")
	perMaster := map[string]int{}
	for _, p := range places {
		master := p.Master
		if master == "" {
			master = "(unknown)"
		}
		perMaster[master]++
		fmt.Fprintf(w, "%d\t%s\t%d\t%s\n", p.Shard, p.Tag, p.Slot, master)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d shards on %d masters\n", len(places), len(perMaster))
	return nil
}
