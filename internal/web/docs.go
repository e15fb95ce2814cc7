package web

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/gin-gonic/gin"
	"go.yaml.in/yaml/v3"
)

// Docs serves the API description: the OpenAPI document as written (YAML)
// and as JSON for the API page and tools, both made once at start-up.
type Docs struct {
	yaml asset
	json asset
}

// NewDocs reads an OpenAPI document in YAML and keeps its JSON form.
func NewDocs(spec []byte) (*Docs, error) {
	var doc any
	if err := yaml.Unmarshal(spec, &doc); err != nil {
		return nil, fmt.Errorf("read api description: %w", err)
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, fmt.Errorf("read api description: not a mapping")
	}
	j, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("api description as json: %w", err)
	}
	return &Docs{yaml: newAsset(spec, "application/yaml"), json: newAsset(j, "application/json")}, nil
}

func newAsset(b []byte, ctype string) asset {
	sum := sha256.Sum256(b)
	return asset{body: b, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
}

// YAML serves /openapi.yaml.
func (d *Docs) YAML(c *gin.Context) { serve(c, d.yaml) }

// JSON serves /openapi.json.
func (d *Docs) JSON(c *gin.Context) { serve(c, d.json) }

// APIPage serves api.html, the readable API reference built in the browser
// from /openapi.json.
func (s *Site) APIPage(c *gin.Context) {
	c.Header("Content-Security-Policy", PageCSP)
	serve(c, s.api)
}
