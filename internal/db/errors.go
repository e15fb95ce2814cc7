package db

import (
	"errors"

	sqlite3 "github.com/glebarez/go-sqlite"
	"github.com/go-sql-driver/mysql"
)

// IsDuplicate reports a unique-key violation: MySQL 1062, or SQLite's
// UNIQUE and PRIMARY KEY constraint codes.
func IsDuplicate(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == 1062
	}
	var se *sqlite3.Error
	if errors.As(err, &se) {
		return se.Code() == 2067 || se.Code() == 1555
	}
	return false
}

// IsRetryable reports an error after which the whole transaction is rolled
// back and tried again: MySQL deadlock (1213) and lock wait timeout (1205),
// SQLite busy and locked.
func IsRetryable(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == 1213 || me.Number == 1205
	}
	var se *sqlite3.Error
	if errors.As(err, &se) {
		c := se.Code() & 0xff
		return c == 5 || c == 6
	}
	return false
}

// IsUnknownVariable reports MySQL error 1193: a system variable the server
// does not have (a MariaDB one asked of MySQL).
func IsUnknownVariable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1193
}
