// Package web serves the shop's page: plain HTML, CSS and JavaScript
// embedded in the binary, no build step. The page talks to the JSON API
// with relative URLs, so it works at any path behind nginx.
package web

import (
	"embed"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/gin-gonic/gin"

	"seckill/internal/apierr"
)

//go:embed static
var files embed.FS

// PageCSP is the page's Content-Security-Policy: scripts and styles only
// from the page's own files (no inline script, no eval), requests only to
// its own origin, never framed.
const PageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// apiCSP is the policy of every other answer: JSON never runs anything.
const apiCSP = "default-src 'none'; frame-ancestors 'none'"

type asset struct {
	body  []byte
	ctype string
	etag  string
}

// Site holds the page's files, read once from the binary.
type Site struct {
	index  asset
	admin  asset
	api    asset
	assets map[string]asset
}

// New reads the embedded files.
func New() (*Site, error) {
	s := &Site{assets: map[string]asset{}}
	err := fs.WalkDir(files, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		s.assets[strings.TrimPrefix(p, "static/")] = newAsset(b, ctype)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read web files: %w", err)
	}
	idx, ok := s.assets["index.html"]
	if !ok {
		return nil, fmt.Errorf("read web files: no index.html")
	}
	s.index = idx
	if s.admin, ok = s.assets["admin.html"]; !ok {
		return nil, fmt.Errorf("read web files: no admin.html")
	}
	if s.api, ok = s.assets["api.html"]; !ok {
		return nil, fmt.Errorf("read web files: no api.html")
	}
	return s, nil
}

// Headers sets the security headers of every answer. API answers carry
// what a JSON API needs (no sniffing, no framing, no caching, a CSP that
// allows nothing); pages and files also get the document-only headers. The
// page's handler replaces the CSP with PageCSP. The values are shared,
// never modified slices: a purchase answer costs no allocation for them.
func Headers() gin.HandlerFunc {
	return func(c *gin.Context) {
		h := c.Writer.Header()
		h["X-Content-Type-Options"] = nosniff
		h["X-Frame-Options"] = deny
		h["Content-Security-Policy"] = apiCSPValue
		if strings.HasPrefix(c.Request.URL.Path, "/api/") {
			h["Cache-Control"] = noStore
		} else {
			h["Referrer-Policy"] = noReferrer
			h["Cross-Origin-Opener-Policy"] = sameOrigin
			h["Permissions-Policy"] = noDevices
		}
		c.Next()
	}
}

var (
	nosniff     = []string{"nosniff"}
	deny        = []string{"DENY"}
	apiCSPValue = []string{apiCSP}
	noStore     = []string{"no-store"}
	noReferrer  = []string{"no-referrer"}
	sameOrigin  = []string{"same-origin"}
	noDevices   = []string{"camera=(), microphone=(), geolocation=(), payment=()"}
)

// Page serves index.html.
func (s *Site) Page(c *gin.Context) {
	c.Header("Content-Security-Policy", PageCSP)
	serve(c, s.index)
}

// AdminPage serves admin.html, the shop's console: the page is public,
// what it shows comes from the admin API routes, with an admin's token.
func (s *Site) AdminPage(c *gin.Context) {
	c.Header("Content-Security-Policy", PageCSP)
	serve(c, s.admin)
}

// Static serves /static/*file.
func (s *Site) Static(c *gin.Context) {
	a, ok := s.assets[strings.TrimPrefix(c.Param("file"), "/")]
	if !ok {
		apierr.Abort(c, http.StatusNotFound, "not_found", "no such file")
		return
	}
	serve(c, a)
}

// serve answers with the file, or 304 when the client holds this version.
// Every load revalidates (no-cache): the files are small and a deploy
// must reach phones at once.
func serve(c *gin.Context, a asset) {
	c.Header("Cache-Control", "no-cache")
	c.Header("ETag", a.etag)
	if match := c.GetHeader("If-None-Match"); match != "" && strings.Contains(match, a.etag) {
		c.Status(http.StatusNotModified)
		return
	}
	c.Data(http.StatusOK, a.ctype, a.body)
}
