package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// IsUnknownDatabase reports MySQL error 1049: the database a DSN names does
// not exist.
func IsUnknownDatabase(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1049
}

// isDenied reports a refusal for want of a privilege: 1044 (no access to a
// database), 1045 (access denied), 1227 (a privilege is needed).
func isDenied(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1044 || me.Number == 1045 || me.Number == 1227)
}

// CreateMySQLDatabase creates the database the DSN names when it does not
// exist, as the DSN's user, through a connection with no database selected
// (one naming a missing database is refused). A first start on a new server
// then needs no hand-made CREATE DATABASE. When the user may not create it,
// the error says what an administrator has to run.
func CreateMySQLDatabase(ctx context.Context, dsn string) error {
	mc, err := ParseDSN(dsn)
	if err != nil {
		return err
	}
	name := mc.DBName
	if name == "" {
		return errors.New("mysql dsn names no database (user:pass@tcp(host:3306)/seckill)")
	}
	user := mc.User
	mc.DBName = ""
	if mc.Timeout == 0 {
		mc.Timeout = dialTimeout
	}
	// On the server that takes writes, of several hosts.
	p, err := newPrimary(mc)
	if err != nil {
		return err
	}
	sqlDB := sql.OpenDB(p)
	defer sqlDB.Close()
	stmt := createStatement(name)
	if _, err := sqlDB.ExecContext(ctx, stmt); err != nil {
		if isDenied(err) {
			return fmt.Errorf("database %q does not exist and user %q may not create it (%w); "+
				"have an administrator run: %s; GRANT ALL PRIVILEGES ON %s.* TO '%s'@'%%'; "+
				"or name a database that exists", name, user, err, stmt, quoteName(name), user)
		}
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return nil
}

// createStatement is the CREATE DATABASE the service runs, and tells an
// administrator to run: utf8mb4, like the tables of the migrations.
func createStatement(name string) string {
	return "CREATE DATABASE IF NOT EXISTS " + quoteName(name) + " CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
}

// quoteName quotes a MySQL identifier: any character may appear in a DSN's
// database name, a backquote is doubled.
func quoteName(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}
