package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
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
		agree(t, s, tok)
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

// FuzzVerifyAgrees signs arbitrary payloads and signatures with the header
// Mint writes, so that the fuzzer reaches the claims: the short path of
// verify and the library's parser must give the same answer on each.
func FuzzVerifyAgrees(f *testing.F) {
	s, err := NewSigner(secret)
	if err != nil {
		f.Fatal(err)
	}
	exp := time.Now().Add(time.Hour).Unix()
	for _, p := range []string{
		fmt.Sprintf(`{"iss":"seckill","sub":"7","role":"user","exp":%d}`, exp),
		fmt.Sprintf(`{"iss":"seckill","sub":"7","role":"admin","exp":%d.5,"nbf":%d}`, exp, exp),
		fmt.Sprintf(`{"iss":"other","sub":"7","role":"user","exp":%d}`, exp),
		`{"iss":"seckill","sub":"7","role":"user","exp":1}`,
		`{"iss":"seckill","sub":"7","role":"user"}`,
		fmt.Sprintf(`{"iss":"seckill","sub":"7","sub":"8","role":"user","exp":%d}`, exp),
		fmt.Sprintf(`{"iss":"seckill","sub":7,"role":"user","exp":%d}`, exp),
		fmt.Sprintf(`{"iss":"seckill","sub":"7","role":"user","exp":"%d"}`, exp),
		fmt.Sprintf(`{"iss":"seckill","sub":"7","role":"user","exp":%d,"aud":["x"]} `, exp),
		fmt.Sprintf(`{"iss":"seckill","sub":"7","role":"user","exp":%d}{}`, exp),
		`null`, `[]`, ``, `{`,
		// Mint's exact form and near misses of it.
		fmt.Sprintf(`{"role":"user","iss":"seckill","sub":"42","exp":%d,"iat":1796004920}`, exp),
		fmt.Sprintf(`{"role":"admin","iss":"seckill","sub":"1","exp":%d,"iat":0}`, exp),
		fmt.Sprintf(`{"role":"user","iss":"seckill","sub":"042","exp":%d,"iat":1}`, exp),
		fmt.Sprintf(`{"role":"user","iss":"seckill","sub":"0","exp":%d,"iat":1}`, exp),
		fmt.Sprintf(`{"role":"user","iss":"seckill","sub":"9223372036854775807","exp":%d,"iat":1}`, exp),
		fmt.Sprintf(`{"role":"user","iss":"seckill","sub":"42","exp":%d0000,"iat":1}`, exp),
		fmt.Sprintf(`{"role":"user","iss":"seckill","sub":"42","exp":0%d,"iat":1}`, exp),
		fmt.Sprintf(`{"role":"user","iss":"seckill","sub":"42","exp":%d,"iat":1} `, exp),
		fmt.Sprintf(`{"role":"us\u0065r","iss":"seckill","sub":"42","exp":%d,"iat":1}`, exp),
		fmt.Sprintf(`{"role":"users","iss":"seckill","sub":"42","exp":%d,"iat":1}`, exp),
		fmt.Sprintf(`{"role":"user","iss":"seckill","sub":"42","exp":%d,"iat":1,"role":"admin"}`, exp),
		fmt.Sprintf(`{"role":"user","iss":"seckill","sub":"42","exp":%d.0,"iat":1}`, exp),
		`{"role":"user","iss":"seckill","sub":"42","exp":1,"iat":1}`,
	} {
		f.Add([]byte(p), uint8(0))
		f.Add([]byte(p), uint8(1))
		f.Add([]byte(p), uint8(2))
	}
	head, _, _ := strings.Cut(mustMint(f, s), ".")
	f.Fuzz(func(t *testing.T, payload []byte, how uint8) {
		body := head + "." + base64.RawURLEncoding.EncodeToString(payload)
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(body))
		sig := base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
		switch how % 4 {
		case 1: // line breaks, which base64 decoding skips
			sig = sig[:10] + "\n" + sig[10:] + "\r\n"
		case 2: // a signature one byte short
			sig = sig[:len(sig)-2]
		case 3: // a wrong signature
			sig = "A" + sig[1:]
		}
		agree(t, s, body+"."+sig)
	})
}

// agree fails when the short path of verify and the library's parser
// answer tok differently.
func agree(t testing.TB, s *Signer, tok string) {
	t.Helper()
	id1, exp1, err1 := s.verify(tok)
	id2, exp2, err2 := s.verifyFull(tok)
	if (err1 == nil) != (err2 == nil) || id1 != id2 || !exp1.Equal(exp2) {
		t.Fatalf("token %q: verify gave (%+v, %v, %v), the library (%+v, %v, %v)", tok, id1, exp1, err1, id2, exp2, err2)
	}
}

func mustMint(tb testing.TB, s *Signer) string {
	tb.Helper()
	tok, err := s.Mint(Identity{UserID: 1, Role: RoleUser}, time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}
