package web

import (
	"encoding/json"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"seckill/docs"
)

// TestDocsServed: the API description is served as written and as JSON
// with the same content, and the API page comes with the page's CSP and
// loads its script from the page's own files (no CDN).
func TestDocsServed(t *testing.T) {
	t.Parallel()
	d, err := NewDocs(docs.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	r := engine(t)
	r.GET("/openapi.yaml", d.YAML)
	r.GET("/openapi.json", d.JSON)
	r.GET("/docs", s.APIPage)

	y := get(r, "/openapi.yaml")
	if y.Code != 200 || y.Header().Get("Content-Type") != "application/yaml" || y.Body.String() != string(docs.OpenAPI) {
		t.Fatalf("openapi.yaml: %d %s, %d bytes", y.Code, y.Header().Get("Content-Type"), y.Body.Len())
	}
	j := get(r, "/openapi.json")
	if j.Code != 200 || !strings.HasPrefix(j.Header().Get("Content-Type"), "application/json") {
		t.Fatalf("openapi.json: %d %s", j.Code, j.Header().Get("Content-Type"))
	}
	var fromJSON, fromYAML any
	if err := json.Unmarshal(j.Body.Bytes(), &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(docs.OpenAPI, &fromYAML); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(fromJSON)
	b, _ := json.Marshal(fromYAML)
	if string(a) != string(b) {
		t.Fatal("openapi.json does not hold what openapi.yaml says")
	}
	if paths, _ := fromJSON.(map[string]any)["paths"].(map[string]any); len(paths) < 10 {
		t.Fatalf("openapi.json has %d paths", len(paths))
	}
	if etag := j.Header().Get("ETag"); etag == "" || get(r, "/openapi.json", "If-None-Match", etag).Code != 304 {
		t.Errorf("openapi.json not revalidated by its ETag %q", etag)
	}

	p := get(r, "/docs")
	if p.Code != 200 || p.Header().Get("Content-Security-Policy") != PageCSP || !strings.Contains(p.Body.String(), `src="static/api.js"`) {
		t.Fatalf("api page: %d, CSP %q", p.Code, p.Header().Get("Content-Security-Policy"))
	}
	if strings.Contains(p.Body.String(), "://") {
		t.Error("the api page loads something from another origin")
	}
	for _, f := range []string{"/static/api.js", "/static/api.css"} {
		if w := get(r, f); w.Code != 200 {
			t.Errorf("%s: %d", f, w.Code)
		}
	}
	if page := get(r, "/").Body.String(); !strings.Contains(page, `href="docs"`) {
		t.Error("the shop page's footer has no link to the API page")
	}
}

// TestDocsRefusesBadDocument: a document that is not a YAML mapping is
// refused at start-up, not served.
func TestDocsRefusesBadDocument(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"openapi: [", "- just\n- a list\n"} {
		if _, err := NewDocs([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
