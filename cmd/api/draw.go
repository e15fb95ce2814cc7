package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"seckill/internal/draw"
	"seckill/internal/voucher"
)

// drawVerifyFlags are the flags of "api draw verify VOUCHER".
func drawVerifyFlags(fs *flag.FlagSet) action {
	url := fs.String("url", "", "read the published draw from this service (e.g. https://shop.example.com) instead of the database")
	var commitment string
	fs.Var(commitmentFlag{&commitment}, "commitment", "the commitment (SHA-256 of the secret, 64 hex digits) as it was published before the close: "+
		"from the buyer's page, which keeps the one it showed at entry, a buyer's record, or the shop's announcement; "+
		"never the one the service shows now, which is what is being checked")
	return func(ctx context.Context, e *cmdEnv) error { return drawVerify(ctx, e, *url, commitment) }
}

// drawKeyOf is the instances' draw key, from their token secret: what
// derives each fair voucher's secret from its salt. The database never
// holds it, so a reader of the database cannot tell a draw's secret before
// it is revealed. Changing SECKILL_TOKEN_SECRET changes it: a draw still
// open then refuses to be drawn (its secret no longer matches its
// commitment).
func drawKeyOf(tokenSecret string) []byte {
	m := hmac.New(sha256.New, []byte(tokenSecret))
	m.Write([]byte("seckill draw key"))
	return m.Sum(nil)
}

// commitmentFlag is a required flag holding a draw's commitment: 64 hex
// digits, kept in lower case.
type commitmentFlag struct{ c *string }

func (commitmentFlag) required() {}

func (f commitmentFlag) Set(s string) error {
	s = strings.ToLower(strings.TrimSpace(s))
	if _, err := hex.DecodeString(s); err != nil || len(s) != 64 {
		return errors.New("must be a SHA-256 in hex (64 digits)")
	}
	*f.c = s
	return nil
}

func (f commitmentFlag) String() string {
	if f.c == nil {
		return ""
	}
	return *f.c
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
		fctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		r, err = draw.Fetch(fctx, http.DefaultClient, url, id)
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
	// Held to the commitment given, published before the close: one the
	// service shows now may have been swapped, with a secret to match.
	cerr := draw.Check(r)
	if r.Draw != nil && r.Draw.Commitment != commitment {
		cerr = errors.Join(fmt.Errorf("the commitment the service shows now, %s, is not the one published before the close, %s", r.Draw.Commitment, commitment), cerr)
	}
	if r.Draw != nil && r.Draw.Secret != "" && voucher.DrawCommitment(r.Draw.Secret) != commitment {
		cerr = errors.Join(fmt.Errorf("the revealed secret's SHA-256 is not the commitment published before the close, %s", commitment), cerr)
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
