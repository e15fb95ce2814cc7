package voucher

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Message is the order the purchase script appends to the stream. The
// purchase side owns this contract; the worker decodes it with Decode.
type Message struct {
	OrderID    int64
	UserID     int64
	VoucherID  int64
	AcceptedAt time.Time
	// Bucket and Buckets name the bucket the order was taken in, of how
	// many (both 0 for a voucher of one bucket, whose messages carry
	// neither): its keys are on shard Keys.BucketShard(VoucherID, Bucket,
	// Buckets).
	Bucket, Buckets int
	// Healed marks an order written again after the database lost it (a
	// failover): Redis still held it, and package failover queued it once
	// more, with its acceptance time taken from its id. Field "healed",
	// "1"; absent on a purchase's message.
	Healed bool
	// Due is the pay deadline the order had when it was first written, as
	// Redis still holds it (a healed order's); zero when not known, and on
	// a purchase's message. Field "due", Unix milliseconds.
	Due time.Time
}

// messageVersion is the "v" field the script writes.
const messageVersion = "1"

// An order's accepted time must fall in this range (the sale windows'
// range): anything else is a corrupt message.
var (
	minAccepted = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	maxAccepted = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
)

// ErrBadMessage marks a stream entry that is not a valid order message.
var ErrBadMessage = errors.New("bad order message")

// Decode reads a stream entry's fields as written by purchase.lua.
func Decode(values map[string]any) (Message, error) {
	str := func(name string) (string, error) {
		v, ok := values[name]
		if !ok {
			return "", fmt.Errorf("%w: no field %q", ErrBadMessage, name)
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("%w: field %q is %T", ErrBadMessage, name, v)
		}
		return s, nil
	}
	positive := func(name string) (int64, error) {
		s, err := str(name)
		if err != nil {
			return 0, err
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%w: field %q is not a positive integer", ErrBadMessage, name)
		}
		return n, nil
	}
	v, err := str("v")
	if err != nil {
		return Message{}, err
	}
	if v != messageVersion {
		return Message{}, fmt.Errorf("%w: unknown version %q", ErrBadMessage, v)
	}
	var m Message
	if m.OrderID, err = positive("order"); err != nil {
		return Message{}, err
	}
	if m.UserID, err = positive("user"); err != nil {
		return Message{}, err
	}
	if m.VoucherID, err = positive("voucher"); err != nil {
		return Message{}, err
	}
	at, err := positive("at")
	if err != nil {
		return Message{}, err
	}
	m.AcceptedAt = time.UnixMilli(at).UTC()
	if m.AcceptedAt.Before(minAccepted) || !m.AcceptedAt.Before(maxAccepted) {
		// The database would refuse it, and the batch would fail for good.
		return Message{}, fmt.Errorf("%w: field \"at\" is out of range", ErrBadMessage)
	}
	if err := m.decodeBucket(values, str); err != nil {
		return Message{}, err
	}
	if err := m.decodeHealed(values, str, positive); err != nil {
		return Message{}, err
	}
	return m, nil
}

// decodeHealed reads the fields a healed order's message carries: "healed"
// ("1") and "due" (a pay deadline, Unix milliseconds, with "healed" only).
func (m *Message) decodeHealed(values map[string]any, str func(string) (string, error), positive func(string) (int64, error)) error {
	_, healed := values["healed"]
	_, due := values["due"]
	if !healed {
		if due {
			return fmt.Errorf("%w: field \"due\" without \"healed\"", ErrBadMessage)
		}
		return nil
	}
	h, err := str("healed")
	if err != nil {
		return err
	}
	if h != "1" {
		return fmt.Errorf("%w: field \"healed\" is %q", ErrBadMessage, h)
	}
	m.Healed = true
	if !due {
		return nil
	}
	ms, err := positive("due")
	if err != nil {
		return err
	}
	if m.Due = time.UnixMilli(ms).UTC(); m.Due.Before(minAccepted) || !m.Due.Before(maxAccepted) {
		return fmt.Errorf("%w: field \"due\" is out of range", ErrBadMessage)
	}
	return nil
}

// decodeBucket reads the fields "b" and "nb" a purchase of a voucher of
// more than one bucket writes: both or neither, 0 <= b < nb,
// 2 <= nb <= MaxBuckets.
func (m *Message) decodeBucket(values map[string]any, str func(string) (string, error)) error {
	_, hasB := values["b"]
	_, hasNB := values["nb"]
	if !hasB && !hasNB {
		return nil
	}
	bs, err := str("b")
	if err != nil {
		return err
	}
	nbs, err := str("nb")
	if err != nil {
		return err
	}
	b, err1 := strconv.Atoi(bs)
	nb, err2 := strconv.Atoi(nbs)
	if err1 != nil || err2 != nil || nb < 2 || nb > MaxBuckets || b < 0 || b >= nb {
		return fmt.Errorf("%w: bucket %q of %q is not a bucket", ErrBadMessage, bs, nbs)
	}
	m.Bucket, m.Buckets = b, nb
	return nil
}

// Encode returns the stream fields of m, as purchase.lua writes them. Tests
// and operators re-queueing a message use it.
func (m Message) Encode() map[string]any {
	f := m.Fields()
	out := make(map[string]any, len(f)/2)
	for i := 0; i < len(f); i += 2 {
		out[f[i]] = f[i+1]
	}
	return out
}

// Fields are the stream fields of m, name then value, in the order
// purchase.lua writes them, then a healed order's: what an XADD of it
// takes.
func (m Message) Fields() []string {
	f := []string{
		"v", messageVersion,
		"order", strconv.FormatInt(m.OrderID, 10),
		"user", strconv.FormatInt(m.UserID, 10),
		"voucher", strconv.FormatInt(m.VoucherID, 10),
		"at", strconv.FormatInt(m.AcceptedAt.UnixMilli(), 10),
	}
	if m.Buckets > 1 {
		f = append(f, "b", strconv.Itoa(m.Bucket), "nb", strconv.Itoa(m.Buckets))
	}
	if m.Healed {
		f = append(f, "healed", "1")
		if !m.Due.IsZero() {
			f = append(f, "due", strconv.FormatInt(m.Due.UnixMilli(), 10))
		}
	}
	return f
}
