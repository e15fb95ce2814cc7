package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/failover"
	"seckill/internal/metrics"
	"seckill/internal/order"
	"seckill/internal/voucher"
)

// opsClients is what the operator commands need: the database and Redis
// of the running service (real servers; embedded mode's Redis is gone with
// its process), and what they build on them.
type opsClients struct {
	db     *gorm.DB
	rdb    redis.UniversalClient
	dead   *order.DeadLetters
	warmer *voucher.Warmer
	close  func()
}

// openOps opens the operator commands' clients.
func openOps(ctx context.Context, cfg config, log *slog.Logger) (*opsClients, error) {
	if cfg.embeddedRedis() {
		return nil, fmt.Errorf("set SECKILL_REDIS_URL (and SECKILL_MYSQL_DSN) to the service's servers; or use the admin routes of a running embedded service")
	}
	rdb, closeRedis, err := openRedis(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	db, closeDB, err := openDB(ctx, cfg, log, false)
	if err != nil {
		closeRedis()
		return nil, err
	}
	keys := saleKeys(cfg, rdb)
	vstore := voucher.NewStore(db)
	warmer := voucher.NewWarmer(vstore, voucher.NewState(rdb, keys), order.NewStore(db), keys, cfg.Warm, log)
	warmer.LeaseTTL(cfg.RebuildLease)
	replicas := confirmAlone(cfg, rdb)
	mover := newMover(cfg, rdb, keys, replicas, crashHooks{}, nil, log)
	// Reconcile counts the units of moves under way through the mover.
	warmer.Quiesce(mover)
	dead := order.NewDeadLetters(db, newReserver(cfg, rdb, keys, replicas, mover))
	return &opsClients{db: db, rdb: rdb, dead: dead, warmer: warmer, close: func() { closeDB(); closeRedis() }}, nil
}

// dlqList runs "api dlq list [--limit N]".
func dlqList(ctx context.Context, e *cmdEnv, limit int) error {
	if limit < 1 || limit > 500 {
		return fmt.Errorf("--limit must be from 1 to 500")
	}
	ops, err := openOps(ctx, e.cfg, e.log)
	if err != nil {
		return err
	}
	defer ops.close()
	ds, err := ops.dead.List(ctx, limit, 0)
	if err != nil {
		return err
	}
	return printJSON(e.stdout, ds)
}

// dlqReplay runs "api dlq replay ID".
func dlqReplay(ctx context.Context, e *cmdEnv) error {
	id, err := strconv.ParseInt(e.args[0], 10, 64)
	if err != nil || id <= 0 {
		return fmt.Errorf("dead letter id must be a positive integer")
	}
	ops, err := openOps(ctx, e.cfg, e.log)
	if err != nil {
		return err
	}
	defer ops.close()
	d, err := ops.dead.Replay(ctx, id)
	if err != nil {
		return err
	}
	return printJSON(e.stdout, map[string]any{"dead_letter": d, "status": "pending"})
}

// reconcileCommand runs "api reconcile [--repair]": with --repair it first
// writes back what the database lost and the sale's Redis still holds;
// then it prints every difference between Redis and the database, and
// fails when there is one. In the embedded mode, whose Redis lives in the
// service's process, the running service does both (its admin listener).
func reconcileCommand(ctx context.Context, e *cmdEnv, repair bool) error {
	if e.cfg.embeddedRedis() {
		return reconcileEmbedded(ctx, e, repair)
	}
	ops, err := openOps(ctx, e.cfg, e.log)
	if err != nil {
		return err
	}
	defer ops.close()
	out := map[string]any{}
	if repair {
		rep, err := newWatcher(e.cfg, ops.rdb, ops.db, nil, nil, e.log).Repair(ctx)
		if err != nil {
			return err
		}
		out["repaired"] = rep
	}
	diffs, err := ops.warmer.Reconcile(ctx)
	if err != nil {
		return err
	}
	out["consistent"], out["differences"] = len(diffs) == 0, diffs
	if err := printJSON(e.stdout, out); err != nil {
		return err
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%d differences between Redis and the database", len(diffs))
	}
	return nil
}

// newWatcher is the database watcher of an instance or a command: it
// heals with a lifecycle of its own, hears through m (nil: nothing).
func newWatcher(cfg config, rdb redis.UniversalClient, g *gorm.DB, gate failover.Gate, m *metrics.Metrics, log *slog.Logger) *failover.Watcher {
	keys := saleKeys(cfg, rdb)
	lcfg := order.LifecycleConfig{Events: voucher.NewEvents(rdb, keys, log)}
	wcfg := failover.WatchConfig{}
	var hobs failover.Observer
	if m != nil {
		lcfg.Observer, wcfg.Observer, hobs = m, m, m
	}
	life := order.NewLifecycle(g, rdb, keys, lcfg, log)
	log = log.With("component", "failover")
	return failover.NewWatcher(g, gate, rdb, keys, failover.NewHealer(g, rdb, keys, life, hobs, log), wcfg, log)
}

// reconcileEmbedded asks the running embedded service, on its admin
// listener, to reconcile (and repair), with an admin token signed with
// the data dir's secret.
func reconcileEmbedded(ctx context.Context, e *cmdEnv, repair bool) error {
	if e.cfg.AdminAddr == "off" {
		return fmt.Errorf("the embedded mode's Redis lives in the service's process: reconcile asks the running service on SECKILL_ADMIN_ADDR, which is off")
	}
	secret, _, _, err := tokenSecret(e.cfg, false)
	if err != nil {
		return err
	}
	signer, err := newSigner(e.cfg, secret)
	if err != nil {
		return err
	}
	version, _, err := adminVersion(ctx, e.cfg, e.log, 1)
	if err != nil {
		return err
	}
	tok, err := signer.Mint(auth.Identity{UserID: 1, Role: auth.RoleAdmin, Version: version}, time.Minute)
	if err != nil {
		return err
	}
	method := http.MethodGet
	if repair {
		method = http.MethodPost
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+e.cfg.AdminAddr+"/admin/reconcile", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := (&http.Client{Timeout: 5 * time.Minute}).Do(req)
	if err != nil {
		return fmt.Errorf("the embedded mode's Redis lives in the service's process: is it running, with its admin listener on %s? %w", e.cfg.AdminAddr, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	dec := json.NewDecoder(resp.Body)
	dec.UseNumber() // passed on as the service wrote them
	if err := dec.Decode(&out); err != nil {
		return fmt.Errorf("the service's answer (%s): %w", resp.Status, err)
	}
	if err := printJSON(e.stdout, out); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the service answered %s", resp.Status)
	}
	if consistent, _ := out["consistent"].(bool); !consistent {
		return fmt.Errorf("differences between Redis and the database")
	}
	return nil
}

// recountCommand runs "api recount": every voucher's order counters set
// to what its orders say, and the vouchers whose counters were wrong
// printed. It needs the database only.
func recountCommand(ctx context.Context, e *cmdEnv) error {
	g, closeDB, err := openDB(ctx, e.cfg, e.log, false)
	if err != nil {
		return err
	}
	defer closeDB()
	fixed, err := order.RecountAll(ctx, g)
	if fixed == nil {
		fixed = []order.Recount{}
	}
	// The vouchers fixed before an error are fixed: they are printed too.
	if perr := printJSON(e.stdout, map[string]any{"recounted": len(fixed), "vouchers": fixed}); err == nil {
		err = perr
	}
	return err
}

// printJSON writes v to w, indented: an operator command's result.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
