package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/go-sql-driver/mysql"

	"seckill/loadtest/grow"
)

// growCmd runs "loadtest grow": how the costs of a sale grow with it.
func growCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("grow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("mysql", growDSN(getenv("SECKILL_MYSQL_DSN")), "a database of the run's own, created if missing, refused if it holds a table, dropped at the end (default: SECKILL_MYSQL_DSN's server, database seckill_grow)")
	redisURL := fs.String("redis", getenv("SECKILL_REDIS_URL"), "one Redis, redis://host:port/db; keys under a prefix of the run's own, deleted at the end (SECKILL_REDIS_URL)")
	sizes := fs.String("sizes", "10000,100000,1000000", "buyers of the voucher measured, ascending, comma-separated")
	table := fs.Int("table-rows", 0, "then fill the orders table to this many rows (an ended voucher's) and measure the last size again, e.g. 10000000")
	purchases := fs.Int("purchases", 2000, "new buyers that measure a purchase at each size")
	keep := fs.Bool("keep", false, "keep the database and the keys")
	jsonPath := fs.String("json", "", "also write the result as JSON to this file (- for stdout)")
	svgPath := fs.String("svg", "", "also draw the figures over the sizes to this SVG file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg := grow.Config{MySQLDSN: *dsn, RedisURL: *redisURL, TableRows: *table, Purchases: *purchases, Keep: *keep, Log: stderr}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--sizes: %q is not a number", s)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	res, err := grow.Run(ctx, cfg)
	if err != nil {
		return err
	}
	printGrow(stdout, res)
	if *svgPath != "" {
		if err := os.WriteFile(*svgPath, grow.SVG(res), 0o644); err != nil {
			return err
		}
	}
	return writeJSON(*jsonPath, stdout, res)
}

// growDSN is dsn with its database named seckill_grow ("" stays "").
func growDSN(dsn string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if dsn == "" || err != nil {
		return dsn
	}
	cfg.DBName = "seckill_grow"
	return cfg.FormatDSN()
}

// printGrow writes a growth run's steps, then each figure's slopes.
func printGrow(w io.Writer, res grow.Result) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "buyers\ttable rows\trebuild s\tRedis B/buyer\tpurchase Redis µs\tpurchase µs\tfigures ms\tsweep ms\treconcile ms\t")
	for _, s := range res.Steps {
		fmt.Fprintf(tw, "%d\t%d\t%.3f\t%.1f\t%.1f\t%.0f\t%.1f\t%.1f\t%.1f\t\n", s.Buyers, s.TableRows, s.RebuildSeconds, s.BytesPerBuyer,
			s.PurchaseRedisMicros, s.PurchaseMicros, s.FiguresMillis, s.SweepMillis, s.ReconcileMillis)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "slopes (cost ~ size^k; 0 flat, 1 linear):")
	for _, sl := range res.Slopes {
		fmt.Fprintf(w, "  %-22s over %-10s %-18s k=%.2f\n", sl.Figure, sl.Over, sl.Range, sl.K)
	}
}
