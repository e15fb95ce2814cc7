package auth

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Versions keeps each user's admin token version, in the database (table
// token_versions, sql/*/0012_token_versions.sql). An admin token carries
// the version its user had when it was minted; Revoke raises the user's,
// and Guard refuses every admin token below it.
//
// The database, not Redis: a revocation must outlive a loss of Redis's
// state, which the sale rebuilds from the database but nothing could
// rebuild a revocation from; a lost one would silently let the revoked
// tokens back in. The price is a primary-key read per request with an
// admin token (buyers' requests read nothing), and admin requests answer
// 503 while the database does not answer, as most of them would anyway.
type Versions struct {
	db *gorm.DB
}

// NewVersions returns Versions on db; it does not own db.
func NewVersions(db *gorm.DB) *Versions { return &Versions{db: db} }

// tokenVersion is a row of token_versions.
type tokenVersion struct {
	UserID    int64     `gorm:"column:user_id;primaryKey"`
	Version   int64     `gorm:"column:version"`
	RevokedAt time.Time `gorm:"column:revoked_at"`
}

func (tokenVersion) TableName() string { return "token_versions" }

// Current is the user's admin token version: 0 for a user whose tokens
// were never revoked.
func (v *Versions) Current(ctx context.Context, userID int64) (int64, error) {
	var vs []int64
	if err := v.db.WithContext(ctx).Raw("SELECT version FROM token_versions WHERE user_id = ?", userID).Scan(&vs).Error; err != nil {
		return 0, fmt.Errorf("read admin token version of user %d: %w", userID, err)
	}
	if len(vs) == 0 {
		return 0, nil
	}
	return vs[0], nil
}

// Revoke raises the user's admin token version by one and returns the new
// one: every admin token of the user minted before is refused from now on,
// on every instance, and those minted after carry the new version.
func (v *Versions) Revoke(ctx context.Context, userID int64, now time.Time) (int64, error) {
	if userID <= 0 {
		return 0, fmt.Errorf("revoke admin tokens: user id must be positive, got %d", userID)
	}
	now = now.UTC().Truncate(time.Millisecond)
	var version int64
	err := v.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		row := tokenVersion{UserID: userID, Version: 1, RevokedAt: now}
		if err := tx.Clauses(clause.OnConflict{
			Columns:   []clause.Column{{Name: "user_id"}},
			DoUpdates: clause.Assignments(map[string]any{"version": gorm.Expr("version + 1"), "revoked_at": now}),
		}).Create(&row).Error; err != nil {
			return err
		}
		return tx.Raw("SELECT version FROM token_versions WHERE user_id = ?", userID).Scan(&version).Error
	})
	if err != nil {
		return 0, fmt.Errorf("revoke admin tokens of user %d: %w", userID, err)
	}
	return version, nil
}
