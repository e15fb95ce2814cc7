package voucher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
)

// Voucher is a coupon put on sale. Stock is what MySQL still has to sell;
// TotalStock is what the sale started with.
type Voucher struct {
	ID        int64  `gorm:"primaryKey"`
	Title     string `gorm:"column:title"`
	FaceValue int64  `gorm:"column:face_value"`
	// Price is what a buyer pays, in the unit of FaceValue (what the
	// voucher is worth); 0: nothing to pay, orders are written paid.
	Price      int64     `gorm:"column:price"`
	TotalStock int       `gorm:"column:total_stock"`
	Stock      int       `gorm:"column:stock"`
	BeginAt    time.Time `gorm:"column:begin_at"`
	EndAt      time.Time `gorm:"column:end_at"`
	// Buckets is how many Redis buckets hold the voucher's stock (1 or
	// more; see Keys.BucketShard). Fixed at creation: a buyer's bucket is
	// Home(user, Buckets).
	Buckets int `gorm:"column:buckets;default:1"`
	// FairWindowMs, when above 0, makes the opening a draw: purchases
	// from the voucher's creation (from BeginAt with a proof of work)
	// until BeginAt + FairWindowMs enter the draw (DrawClose), which then
	// buys them in an order the draw's secret and the closed entry list
	// fix (package draw). DrawDoneAt is when the draw was done.
	FairWindowMs int64      `gorm:"column:fair_window_ms;default:0"`
	DrawDoneAt   *time.Time `gorm:"column:draw_done_at"`
	// DrawCommitment is the SHA-256 of the draw's secret, stored once at
	// creation (the database refuses a change) and published from then
	// on. DrawSalt is what the secret is derived from with the instances'
	// draw key (DrawSecretOf): the database alone cannot tell the secret.
	// DrawSecret is the secret once revealed, after the draw; a voucher
	// made before commitments were stored holds its secret there from
	// the start and no DrawCommitment.
	DrawCommitment string `gorm:"column:draw_commitment;default:''"`
	DrawSalt       string `gorm:"column:draw_salt;default:''"`
	DrawSecret     string `gorm:"column:draw_secret;default:''"`
	// DrawDigest is the SHA-256 of the closed entry list, published at
	// the close; every rank depends on it.
	DrawDigest string `gorm:"column:draw_digest;default:''"`
	// DrawPowNonce is a random value the proof of work hashes, published
	// when entries open (BeginAt), so no proof can be made earlier.
	DrawPowNonce string `gorm:"column:draw_pow_nonce;default:''"`
	// PowBits, above 0, makes entering the draw cost a proof of work: a
	// nonce whose SHA-256 with the draw's challenge (DrawChallenge) and
	// the buyer starts with PowBits zero bits (package draw).
	PowBits   int       `gorm:"column:pow_bits;default:0"`
	CreatedAt time.Time `gorm:"column:created_at"`
	UpdatedAt time.Time `gorm:"column:updated_at"`
}

// TableName is the table of sql/*/0001_init.sql.
func (Voucher) TableName() string { return "vouchers" }

// ErrNotFound means no voucher has the id.
var ErrNotFound = errors.New("voucher not found")

// Store reads and writes vouchers in the database.
type Store struct {
	db *gorm.DB
}

// NewStore returns a Store on db; it does not own db.
func NewStore(db *gorm.DB) *Store { return &Store{db: db} }

// Create inserts v and sets its id. Stock starts at TotalStock.
func (s *Store) Create(ctx context.Context, v *Voucher) error {
	now := time.Now().UTC()
	v.Stock = v.TotalStock
	v.CreatedAt, v.UpdatedAt = now, now
	v.BeginAt, v.EndAt = v.BeginAt.UTC(), v.EndAt.UTC()
	if err := s.db.WithContext(ctx).Create(v).Error; err != nil {
		return fmt.Errorf("create voucher: %w", err)
	}
	return nil
}

// Get returns one voucher, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (Voucher, error) {
	var v Voucher
	err := s.db.WithContext(ctx).Where("id = ?", id).Take(&v).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Voucher{}, fmt.Errorf("get voucher %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Voucher{}, fmt.Errorf("get voucher %d: %w", id, err)
	}
	return v, nil
}

// List returns up to limit vouchers, newest first, with ids below before
// (0 for the first page).
func (s *Store) List(ctx context.Context, limit int, before int64) ([]Voucher, error) {
	q := s.db.WithContext(ctx).Order("id DESC").Limit(limit)
	if before > 0 {
		q = q.Where("id < ?", before)
	}
	var vs []Voucher
	if err := q.Find(&vs).Error; err != nil {
		return nil, fmt.Errorf("list vouchers: %w", err)
	}
	return vs, nil
}

// Live returns the vouchers whose sale has not ended at now: the ones whose
// Redis state must exist.
func (s *Store) Live(ctx context.Context, now time.Time) ([]Voucher, error) {
	return s.live(ctx, now, "")
}

// LiveFair is Live's vouchers that open with a draw.
func (s *Store) LiveFair(ctx context.Context, now time.Time) ([]Voucher, error) {
	return s.live(ctx, now, "fair_window_ms > 0")
}

func (s *Store) live(ctx context.Context, now time.Time, and string) ([]Voucher, error) {
	q := s.db.WithContext(ctx).Where("end_at > ?", db.Millis(now))
	if and != "" {
		q = q.Where(and)
	}
	var vs []Voucher
	if err := q.Order("id").Find(&vs).Error; err != nil {
		return nil, fmt.Errorf("list live vouchers: %w", err)
	}
	return vs, nil
}
