// Package failing logs a background loop's failures the way an operator
// reads them: a line when a failure starts, another whenever its cause
// changes (a master down, then a rebuild refused), and one when the loop
// works again, never a line per round. The last line logged says why the
// loop does not work now.
package failing

import (
	"context"
	"log/slog"
)

// Log follows one loop's rounds; its zero value needs Log and What set.
type Log struct {
	Log  *slog.Logger
	What string // "warming voucher state": "... failed; retrying", "... works again"
	last string // the failing cause last logged, "" while the loop works
}

// Round tells the outcome of one round. A round cut short by ctx's end is
// no failure.
func (f *Log) Round(ctx context.Context, err error) {
	switch {
	case err != nil && ctx.Err() == nil && err.Error() != f.last:
		f.Log.Warn(f.What+" failed; retrying", "err", err)
		f.last = err.Error()
	case err == nil && f.last != "":
		f.Log.Info(f.What + " works again")
		f.last = ""
	}
}
