package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"seckill/internal/draw"
)

// drawVerifyFlags are the flags of "api draw verify VOUCHER".
func drawVerifyFlags(fs *flag.FlagSet) action {
	url := fs.String("url", "", "read the published draw from this service (e.g. https://shop.example.com) instead of the database")
	commitment := fs.String("commitment", "", "the commitment (SHA-256 of the secret) as published before the close, to hold the draw to")
	return func(ctx context.Context, e *cmdEnv) error { return drawVerify(ctx, e, *url, *commitment) }
}

// drawVerify runs "api draw verify VOUCHER": recomputes a fair voucher's
// draw from its published secret (draw.Check) and prints what it found;
// an error (exit 1) when the draw does not check.
func drawVerify(ctx context.Context, e *cmdEnv, url, commitment string) error {
	id, err := strconv.ParseInt(e.args[0], 10, 64)
	if err != nil || id <= 0 {
		return fmt.Errorf("VOUCHER must be a voucher id, not %q", e.args[0])
	}
	var r draw.Result
	if url != "" {
		r, err = fetchDraw(ctx, url, id)
	} else {
		db, closeDB, oerr := openDB(ctx, e.cfg, e.log, false)
		if oerr != nil {
			return oerr
		}
		defer closeDB()
		r, err = draw.Results(ctx, db, id)
	}
	if err != nil {
		return err
	}
	cerr := draw.Check(r)
	if cerr == nil && commitment != "" && r.Draw.Commitment != strings.ToLower(commitment) {
		cerr = fmt.Errorf("the draw's commitment %s is not the one given, %s", r.Draw.Commitment, commitment)
	}
	won := 0
	for _, en := range r.Entries {
		if en.Won {
			won++
		}
	}
	out := map[string]any{"voucher_id": id, "commitment": r.Draw.Commitment, "secret": r.Draw.Secret,
		"entries": len(r.Entries), "winners": won, "ok": cerr == nil}
	if cerr != nil {
		out["problems"] = strings.Split(cerr.Error(), "\n")
	}
	if err := printJSON(e.stdout, out); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("the draw of voucher %d does not check", id)
	}
	return nil
}

// fetchDraw reads GET /api/v1/vouchers/{id}/draw of the service at base.
func fetchDraw(ctx context.Context, base string, id int64) (draw.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/api/v1/vouchers/"+strconv.FormatInt(id, 10)+"/draw", nil)
	if err != nil {
		return draw.Result{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return draw.Result{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return draw.Result{}, fmt.Errorf("GET %s: %s", req.URL, resp.Status)
	}
	var r draw.Result
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return draw.Result{}, fmt.Errorf("GET %s: %w", req.URL, err)
	}
	return r, nil
}
