package voucher

// MigratedMySQL is migratedMySQL for package voucher_test.
var MigratedMySQL = migratedMySQL
