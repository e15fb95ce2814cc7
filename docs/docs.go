// Package docs holds the API description, openapi.yaml, embedded so that
// the binary serves the document its routes are tested against.
package docs

import _ "embed"

// OpenAPI is openapi.yaml as written.
//
//go:embed openapi.yaml
var OpenAPI []byte
