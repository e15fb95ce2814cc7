package auth

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
)

// User is a shopper who logged in with a phone. Ids start at 1,000,000
// (sql/*/0002_users.sql): lower ids are left to tokens minted by the
// operator (api token --user N), so the two never name the same person.
type User struct {
	ID          int64     `gorm:"primaryKey"`
	Phone       string    `gorm:"column:phone"`
	CreatedAt   time.Time `gorm:"column:created_at"`
	LastLoginAt time.Time `gorm:"column:last_login_at"`
}

// TableName is the table of sql/*/0002_users.sql.
func (User) TableName() string { return "users" }

// Users reads and writes the users table.
type Users struct {
	db *gorm.DB
}

// NewUsers returns a Users on db; it does not own db.
func NewUsers(db *gorm.DB) *Users { return &Users{db: db} }

// Login returns the user with the phone, creating it on a first login, and
// records the login time. Two first logins at once make one user: the
// unique phone key refuses the second insert, which then reads the first.
func (u *Users) Login(ctx context.Context, phone string, now time.Time) (User, bool, error) {
	now = now.UTC().Truncate(time.Millisecond)
	tx := u.db.WithContext(ctx)
	var usr User
	err := tx.Where("phone = ?", phone).Take(&usr).Error
	if err == nil {
		if err := tx.Model(&User{}).Where("id = ?", usr.ID).Update("last_login_at", now).Error; err != nil {
			return User{}, false, fmt.Errorf("record login of user %d: %w", usr.ID, err)
		}
		usr.LastLoginAt = now
		return usr, false, nil
	}
	if !errors.Is(err, gorm.ErrRecordNotFound) {
		return User{}, false, fmt.Errorf("find user by phone: %w", err)
	}
	usr = User{Phone: phone, CreatedAt: now, LastLoginAt: now}
	err = tx.Create(&usr).Error
	if err == nil {
		return usr, true, nil
	}
	if !db.IsDuplicate(err) {
		return User{}, false, fmt.Errorf("create user: %w", err)
	}
	if err := tx.Where("phone = ?", phone).Take(&usr).Error; err != nil {
		return User{}, false, fmt.Errorf("find user by phone after a concurrent first login: %w", err)
	}
	return usr, false, nil
}
