package voucher

import (
	"errors"
	"testing"
	"time"
)

// FuzzDecode feeds Decode stream entries as a hostile or broken producer
// might write them. It never panics; it refuses with ErrBadMessage, or
// returns positive ids that survive an Encode/Decode round trip. The seeds
// run as a plain test.
func FuzzDecode(f *testing.F) {
	ok := Message{OrderID: 120675968935596032, UserID: 42, VoucherID: 1, AcceptedAt: time.UnixMilli(1767225600000).UTC()}.Encode()
	seed := func(v, order, user, voucher, at string, drop uint8, nonString bool) {
		f.Add(v, order, user, voucher, at, drop, nonString)
	}
	seed(ok["v"].(string), ok["order"].(string), ok["user"].(string), ok["voucher"].(string), ok["at"].(string), 0, false)
	seed("1", "1", "1", "1", "1", 0, false)
	seed("2", "1", "1", "1", "1", 0, false)
	seed("", "", "", "", "", 0, false)
	seed("1", "0", "1", "1", "1", 0, false)
	seed("1", "-1", "1", "1", "1", 0, false)
	seed("1", "9223372036854775808", "1", "1", "1", 0, false)
	seed("1", "1e3", " 1", "+1", "0x10", 0, false)
	seed("1", "1", "1", "1", "9223372036854775807", 0, false)
	seed("1", "1", "1", "1", "1", 3, false)
	seed("1", "1", "1", "1", "1", 0, true)
	seed("1", "１", "1", "1", "1", 0, false)
	f.Fuzz(func(t *testing.T, v, order, user, voucher, at string, drop uint8, nonString bool) {
		names := []string{"v", "order", "user", "voucher", "at"}
		values := map[string]any{"v": v, "order": order, "user": user, "voucher": voucher, "at": at}
		if drop > 0 {
			delete(values, names[int(drop)%len(names)])
		}
		if nonString {
			values[names[int(drop/8)%len(names)]] = int64(7)
		}
		m, err := Decode(values)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("refusal is not ErrBadMessage: %v", err)
			}
			if m != (Message{}) {
				t.Fatalf("refused entry returned %+v", m)
			}
			return
		}
		if m.OrderID <= 0 || m.UserID <= 0 || m.VoucherID <= 0 || m.AcceptedAt.UnixMilli() <= 0 {
			t.Fatalf("accepted %v as %+v", values, m)
		}
		again, err := Decode(m.Encode())
		if err != nil || again != m {
			t.Fatalf("round trip of %+v: %+v, %v", m, again, err)
		}
	})
}
