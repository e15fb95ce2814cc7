package auth

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// FuzzParse feeds Parse arbitrary strings: it never panics, and whatever
// it accepts is a token this signer made (HS256, our secret) for a valid
// identity. The seeds run as a plain test.
func FuzzParse(f *testing.F) {
	s, err := NewSigner(secret)
	if err != nil {
		f.Fatal(err)
	}
	other, _ := NewSigner([]byte("another-secret-another-secret-xx"))
	good, _ := s.Mint(Identity{UserID: 7, Role: RoleUser}, time.Hour)
	admin, _ := s.Mint(Identity{UserID: 1, Role: RoleAdmin}, time.Hour)
	forged, _ := other.Mint(Identity{UserID: 7, Role: RoleAdmin}, time.Hour)
	parts := strings.Split(good, ".")
	b64 := base64.RawURLEncoding.EncodeToString
	for _, seed := range []string{
		"", ".", "..", "...", good, admin, forged, good + "x", "Bearer " + good,
		b64([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + parts[1] + ".",
		b64([]byte(`{"alg":"HS256"}`)) + "." + b64([]byte(`{"sub":"-1","role":"user","iss":"seckill","exp":99999999999}`)) + "." + parts[2],
		b64([]byte(`{"alg":"HS256"}`)) + "." + b64([]byte(`{"sub":"99999999999999999999","role":"admin"}`)) + ".x",
		parts[0] + "." + parts[1], strings.Repeat("A", 4096), "\x00.\xff.\xfe",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		id, err := s.Parse(tok)
		if err != nil {
			if id != (Identity{}) {
				t.Fatalf("refused token returned identity %+v", id)
			}
			return
		}
		if id.UserID <= 0 || (id.Role != RoleUser && id.Role != RoleAdmin) {
			t.Fatalf("accepted token with identity %+v", id)
		}
		head, _, _ := strings.Cut(tok, ".")
		raw, err := base64.RawURLEncoding.DecodeString(head)
		if err != nil {
			t.Fatalf("accepted token with an undecodable header: %v", err)
		}
		var h struct {
			Alg string `json:"alg"`
		}
		if json.Unmarshal(raw, &h) != nil || h.Alg != "HS256" {
			t.Fatalf("accepted token with header %s", raw)
		}
	})
}

// FuzzMintParse: every identity Mint accepts parses back unchanged.
func FuzzMintParse(f *testing.F) {
	s, err := NewSigner(secret)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(int64(42), false, int64(60))
	f.Add(int64(1), true, int64(1))
	f.Add(int64(-5), false, int64(60))
	f.Add(int64(9223372036854775807), true, int64(3600))
	f.Add(int64(3), false, int64(-1))
	f.Fuzz(func(t *testing.T, uid int64, admin bool, ttlSecs int64) {
		role := RoleUser
		if admin {
			role = RoleAdmin
		}
		ttl := time.Duration(ttlSecs%(400*24*3600)) * time.Second
		tok, err := s.Mint(Identity{UserID: uid, Role: role}, ttl)
		if err != nil {
			if uid > 0 && ttl > 0 {
				t.Fatalf("mint(%d, %s, %v): %v", uid, role, ttl, err)
			}
			return
		}
		if uid <= 0 || ttl <= 0 {
			t.Fatalf("minted a token for user %d with ttl %v", uid, ttl)
		}
		id, err := s.Parse(tok)
		if err != nil || id != (Identity{UserID: uid, Role: role}) {
			t.Fatalf("round trip of user %d %s: %+v, %v", uid, role, id, err)
		}
	})
}
