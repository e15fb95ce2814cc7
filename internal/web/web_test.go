package web

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
)

func engine(t testing.TB) *gin.Engine {
	t.Helper()
	gin.SetMode(gin.TestMode)
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.Use(Headers())
	r.GET("/", s.Page)
	r.GET("/admin", s.AdminPage)
	r.GET("/static/*file", s.Static)
	r.GET("/api/v1/x", func(c *gin.Context) { c.JSON(200, gin.H{}) })
	return r
}

func get(r http.Handler, path string, hdr ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	return w
}

func TestPageAndHeaders(t *testing.T) {
	t.Parallel()
	r := engine(t)
	w := get(r, "/")
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("page: %d %s", w.Code, w.Header().Get("Content-Type"))
	}
	want := map[string]string{
		"Content-Security-Policy": PageCSP, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
		"Referrer-Policy": "no-referrer",
	}
	for k, v := range want {
		if got := w.Header().Get(k); got != v {
			t.Errorf("page %s = %q, want %q", k, got, v)
		}
	}
	for _, must := range []string{"script-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(PageCSP, must) {
			t.Errorf("CSP lacks %s", must)
		}
	}
	if strings.Contains(PageCSP, "unsafe") {
		t.Error("CSP allows unsafe-inline or unsafe-eval")
	}
	api := get(r, "/api/v1/x")
	if api.Header().Get("Cache-Control") != "no-store" || api.Header().Get("X-Content-Type-Options") != "nosniff" ||
		api.Header().Get("X-Frame-Options") != "DENY" || api.Header().Get("Content-Security-Policy") != apiCSP {
		t.Errorf("api headers: %v", api.Header())
	}
	// A second answer gets its own values: the shared ones are not
	// modified through an earlier answer's header map.
	api.Header().Add("X-Frame-Options", "SAMEORIGIN")
	if again := get(r, "/api/v1/x"); len(again.Header().Values("X-Frame-Options")) != 1 {
		t.Errorf("a header value leaked between answers: %v", again.Header().Values("X-Frame-Options"))
	}
}

// TestNoInlineCode: the CSP forbids inline scripts, handlers and style
// attributes; the page must not need them.
func TestNoInlineCode(t *testing.T) {
	t.Parallel()
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	for page, html := range map[string]string{"index.html": string(s.index.body), "admin.html": string(s.admin.body)} {
		noInlineCode(t, page, html)
	}
	for _, name := range []string{"app.js", "admin.js"} {
		js := string(s.assets[name].body)
		for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
			if strings.Contains(js, bad) {
				t.Errorf("%s uses %s", name, bad)
			}
		}
	}
}

// TestAdminPage: the console is its own page under the page's CSP, and
// the shop page offers no token box (the console does).
func TestAdminPage(t *testing.T) {
	t.Parallel()
	r := engine(t)
	w := get(r, "/admin")
	if w.Code != 200 || w.Header().Get("Content-Security-Policy") != PageCSP || !strings.Contains(w.Body.String(), `src="static/admin.js"`) {
		t.Fatalf("console page: %d %v", w.Code, w.Header())
	}
	if !strings.Contains(w.Body.String(), `id="token-form"`) {
		t.Error("the console has no token box for staff")
	}
	if shop := get(r, "/").Body.String(); strings.Contains(shop, `id="token"`) || strings.Contains(shop, "admin.js") {
		t.Error("the shop page offers a token box or the console's script")
	}
}

func noInlineCode(t *testing.T, page, html string) {
	t.Helper()
	for name, re := range map[string]*regexp.Regexp{
		"event handler":    regexp.MustCompile(`(?i)\son[a-z]+\s*=`),
		"style attribute":  regexp.MustCompile(`(?i)\sstyle\s*=`),
		"javascript: link": regexp.MustCompile(`(?i)javascript:`),
		"absolute api url": regexp.MustCompile(`["'(]/(api|static)/`),
	} {
		if loc := re.FindStringIndex(html); loc != nil {
			t.Errorf("%s has an %s: %q", page, name, html[loc[0]:min(len(html), loc[1]+40)])
		}
	}
	for _, m := range regexp.MustCompile(`(?is)<script([^>]*)>(.*?)</script>`).FindAllStringSubmatch(html, -1) {
		if !strings.Contains(m[1], "src=") || strings.TrimSpace(m[2]) != "" {
			t.Errorf("%s has an inline script: %q", page, m[0])
		}
	}
}

func TestStatic(t *testing.T) {
	t.Parallel()
	r := engine(t)
	for path, ctype := range map[string]string{"/static/app.js": "javascript", "/static/app.css": "text/css", "/static/favicon.svg": "image/svg+xml"} {
		w := get(r, path)
		if w.Code != 200 || !strings.Contains(w.Header().Get("Content-Type"), ctype) {
			t.Errorf("%s: %d %q", path, w.Code, w.Header().Get("Content-Type"))
		}
		if again := get(r, path, "If-None-Match", w.Header().Get("ETag")); again.Code != http.StatusNotModified {
			t.Errorf("%s with its etag: %d, want 304", path, again.Code)
		}
	}
	for _, path := range []string{"/static/", "/static/nope.js", "/static/../web.go", "/static/%2e%2e/web.go", "/static/index.html/"} {
		w := get(r, path)
		if w.Code != 404 || !strings.Contains(w.Body.String(), `"code":"not_found"`) {
			t.Errorf("%s: %d %s", path, w.Code, w.Body.String())
		}
	}
}
