package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// The guides' shell blocks: README.md and docs/*.md are the pages a reader
// copies commands from. Every sh, bash or console block is checked; the
// ones marked <!-- doc-test: run --> are run against the service built
// from this tree; those marked <!-- doc-test: drill --> are run by a fault
// drill of internal/fault, which reads them from the guide. docs/testing.md
// says which are which.

// repoRoot is the repository, from cmd/api.
const repoRoot = "../.."

var (
	fenceLine = regexp.MustCompile("^```\\s*([A-Za-z0-9_-]*)\\s*$")
	docMark   = regexp.MustCompile(`^<!-- doc-test: (\S+)((?:\s+[A-Z][A-Z0-9_]*=\S*)*)\s*-->$`)
	anyMark   = regexp.MustCompile(`^\s*<!--\s*doc-test`) // a line that is a mark
	// apiLine finds the binary's commands: "go run ./cmd/api WORDS", or
	// "api WORDS" where a command starts (line start, $(, ;, |, &, `).
	apiLine = regexp.MustCompile("(?:go run \\./cmd/api|(?:^|[$]\\(|[;|&(`]\\s*)(?:\\./)?api)\\b((?:[ \\t]+[a-z][a-z-]*)*)")
	// repoPath finds paths into the repository's directories.
	repoPath = regexp.MustCompile(`(?:^|[^\w./-])((?:scripts|loadtest|internal|cmd|deploy|nginx|lua|sql|docs)/[\w./-]*\w)`)
	envName  = regexp.MustCompile(`SECKILL_[A-Z0-9_]*[A-Z0-9]`)
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading  = regexp.MustCompile(`^#{1,6}\s+(.+?)\s*$`)
	// expected is a walkthrough's comment that shows what the command
	// above it prints: "#   {...}".
	expected = regexp.MustCompile(`^#\s{2,}(\S.*)$`)
)

// docBlock is one shell block of a guide.
type docBlock struct {
	file string // relative to the repository
	line int    // the opening fence's
	lang string
	mark string            // "run", "check", "drill" (run by internal/fault), or "" (checked)
	env  map[string]string // the service's settings after "run"
	text string            // the commands; a console block's "$ " lines
}

func (b docBlock) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// docFiles are the guides, relative to the repository.
func docFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, f := range files {
		rel, _ := filepath.Rel(repoRoot, f)
		out = append(out, filepath.ToSlash(rel))
	}
	return out
}

func readDoc(t testing.TB, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// shellBlocks reads file's sh, bash and console blocks and their marks;
// a mark that is not one, or not right above a block, fails the test.
func shellBlocks(t testing.TB, file string) []docBlock {
	t.Helper()
	lines := strings.Split(readDoc(t, file), "\n")
	var out []docBlock
	for i := 0; i < len(lines); i++ {
		m := fenceLine.FindStringSubmatch(lines[i])
		if m == nil {
			if anyMark.MatchString(lines[i]) && (i+1 >= len(lines) || !fenceLine.MatchString(lines[i+1])) {
				t.Errorf("%s:%d: a doc-test mark not on the line before a block", file, i+1)
			}
			continue
		}
		start := i
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, lines[i])
		}
		lang := m[1]
		if lang != "sh" && lang != "bash" && lang != "console" {
			continue
		}
		b := docBlock{file: file, line: start + 1, lang: lang}
		if start > 0 && anyMark.MatchString(lines[start-1]) {
			mm := docMark.FindStringSubmatch(strings.TrimSpace(lines[start-1]))
			if mm == nil || !slices.Contains([]string{"run", "check", "drill"}, mm[1]) || (mm[1] != "run" && mm[2] != "") {
				t.Errorf("%s:%d: %q is not <!-- doc-test: run [NAME=value ...] -->, <!-- doc-test: check --> or <!-- doc-test: drill -->", file, start, lines[start-1])
			} else {
				b.mark = mm[1]
				b.env = map[string]string{}
				for _, kv := range strings.Fields(mm[2]) {
					k, v, _ := strings.Cut(kv, "=")
					b.env[k] = v
				}
			}
		}
		if lang == "console" {
			var cmds []string
			for _, l := range body {
				if c, ok := strings.CutPrefix(l, "$ "); ok {
					cmds = append(cmds, c)
				}
			}
			body = cmds
		}
		b.text = strings.Join(body, "\n") + "\n"
		out = append(out, b)
	}
	return out
}

// knownNames are the SECKILL_* names a guide may name: the settings
// table's, and those the scripts, the nginx template, the compose files
// and the test servers read (the local cluster's, nginx's, the tests').
func knownNames(t testing.TB) map[string]bool {
	t.Helper()
	known := map[string]bool{}
	for _, s := range settings() {
		known[s.name] = true
	}
	var files []string
	for _, g := range []string{"scripts/*.sh", "loadtest/*.sh", "nginx/*.template", "docker-compose*.yml", "internal/testenv/*.go"} {
		m, err := filepath.Glob(filepath.Join(repoRoot, g))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 5 {
		t.Fatalf("only %d files to read SECKILL_ names from", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range envName.FindAllString(string(b), -1) {
			known[n] = true
		}
	}
	return known
}

// checkAPI reports a command of the binary that the commands table does
// not have, in one line of a block or one code span of the prose.
func checkAPI(line string) []string {
	var bad []string
	for _, m := range apiLine.FindAllStringSubmatch(line, -1) {
		words := strings.Fields(m[1])
		if len(words) == 0 {
			continue // the service itself
		}
		// A group's word alone ("api dlq") lists its commands; followed by
		// another word, that word must be one of them.
		if cmd, _, group := findCommand(words); cmd == nil && (len(group) == 0 || len(words) > 1) {
			bad = append(bad, "api "+strings.Join(words, " "))
		}
	}
	return bad
}

// withoutComment is a shell line without its comment (a # at the start or
// after a blank; quoted #s are rare enough in the guides).
func withoutComment(line string) string {
	if strings.HasPrefix(strings.TrimSpace(line), "#") {
		return ""
	}
	if i := strings.Index(line, " #"); i >= 0 {
		return line[:i]
	}
	return line
}

// slug is a heading's anchor as GitHub makes it.
func slug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		case r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the headings of a Markdown file (outside its code blocks).
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	inCode := false
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil && !inCode {
			out[slug(m[1])] = true
		}
	}
	return out
}

// TestDocShellBlocks: every sh, bash and console block of README.md and
// docs/*.md parses (bash -n); every command of the binary it names is in
// the commands table (also in the prose's code spans); every path into the
// repository's directories it or the prose names exists; every SECKILL_*
// name is a setting or one the scripts, nginx or the tests read; every
// relative link reaches a file, and its anchor a heading.
func TestDocShellBlocks(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash not found")
	}
	known := knownNames(t)
	blocks := 0
	for _, file := range docFiles(t) {
		text := readDoc(t, file)
		for _, b := range shellBlocks(t, file) {
			blocks++
			cmd := exec.Command(bash, "-n")
			cmd.Stdin = strings.NewReader(b.text)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s: bash -n: %v\n%s", b, err, out)
			}
			for line := range strings.Lines(b.text) {
				for _, bad := range checkAPI(withoutComment(line)) {
					t.Errorf("%s: %q: the binary has no command %q (api --help lists them)", b, strings.TrimSpace(line), bad)
				}
			}
		}
		// The prose's code spans name commands too: `api dlq list`.
		for _, span := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(text, -1) {
			if s := span[1]; strings.HasPrefix(s, "api ") || strings.HasPrefix(s, "go run ./cmd/api") {
				for _, bad := range checkAPI(s) {
					t.Errorf("%s: `%s`: the binary has no command %q", file, s, bad)
				}
			}
		}
		for _, m := range repoPath.FindAllStringSubmatch(text, -1) {
			p := strings.TrimRight(m[1], ".")
			if p == "scripts/s" {
				continue // a rate: Redis scripts a second
			}
			if _, err := os.Stat(filepath.Join(repoRoot, p)); err != nil {
				t.Errorf("%s names %s, which does not exist", file, p)
			}
		}
		for _, n := range envName.FindAllString(text, -1) {
			if !known[n] {
				t.Errorf("%s names %s, which is neither a setting (docs/operating.md, Settings) nor read by the scripts, nginx or the tests", file, n)
			}
		}
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			p, anchor, _ := strings.Cut(target, "#")
			dest := file
			if p != "" {
				dest = filepath.ToSlash(filepath.Join(filepath.Dir(file), p))
				if _, err := os.Stat(filepath.Join(repoRoot, dest)); err != nil {
					t.Errorf("%s links to %s, which does not exist", file, target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(dest, ".md") && !anchors(readDoc(t, dest))[anchor] {
				t.Errorf("%s links to %s: %s has no heading #%s", file, target, dest, anchor)
			}
		}
	}
	if blocks < 10 {
		t.Fatalf("only %d shell blocks found: are the guides read?", blocks)
	}
}

// TestDocCheckCatches: the checks above see what they look for.
func TestDocCheckCatches(t *testing.T) {
	t.Parallel()
	for line, want := range map[string][]string{
		"go run ./cmd/api dlq list --limit 5":            nil,
		"go run ./cmd/api buckets settle VOUCHER":        nil,
		"ADMIN=$(go run ./cmd/api token --user 1)":       nil,
		"go run ./cmd/api":                               nil,
		"curl -s localhost:8080/api/v1/vouchers":         nil,
		"scripts/cluster-up.sh api":                      nil,
		"go run ./cmd/api dlq purge":                     {"api dlq purge"}, // a group's word: dlq has list and replay only
		"x=$(api reconcil)":                              {"api reconcil"},
		"go run ./cmd/api shards | api rebalance":        {"api rebalance"},
		"go run ./cmd/api reconcile; go run ./cmd/api x": {"api x"},
	} {
		if got := checkAPI(line); !slices.Equal(got, want) {
			t.Errorf("checkAPI(%q) = %q, want %q", line, got, want)
		}
	}
	if got := slug("Upgrades and migrations"); got != "upgrades-and-migrations" {
		t.Errorf("slug: %q", got)
	}
	if got := slug("After the grab: pay, or the unit goes back on sale"); got != "after-the-grab-pay-or-the-unit-goes-back-on-sale" {
		t.Errorf("slug: %q", got)
	}
	if got := slug("The documentation's shell blocks"); got != "the-documentations-shell-blocks" {
		t.Errorf("slug: %q", got)
	}
}

// expectPattern turns a walkthrough's expected output into a pattern:
// "..." matches anything, a number of ten digits or more (an order id)
// any number, and a note in brackets after two blanks is left out.
func expectPattern(want string) *regexp.Regexp {
	want = regexp.MustCompile(`\s{2,}\(.*\)$`).ReplaceAllString(want, "")
	parts := strings.Split(want, "...")
	for i, p := range parts {
		parts[i] = regexp.MustCompile(`[0-9]{10,}`).ReplaceAllString(regexp.QuoteMeta(p), `[0-9]+`)
	}
	return regexp.MustCompile(`(?s)^` + strings.Join(parts, ".*") + `$`)
}

// expectSep separates the outputs of a walkthrough's commands.
const expectSep = "@@doc-test: output above@@"

// apiShim stands the built binary in for "go run ./cmd/api" in a block;
// any other go command is refused.
const apiShim = `go() {
  if [ "${1-}" = run ] && [ "${2-}" = ./cmd/api ]; then shift 2; "$DOC_TEST_API" "$@"; return; fi
  echo "doc test: only 'go run ./cmd/api' is run here, not: go $*" >&2; return 1
}
`

// TestReadmeWalkthroughs runs README's blocks marked run as a reader would:
// the binary built from this tree, the service started in embedded mode
// in an empty directory (its files in ./seckill-data) on a free loopback
// port, with the mark's settings; the block run by bash from that
// directory, "go run ./cmd/api" being the built binary and localhost:8080
// the service. Each "#   {...}" line is what the command above it prints.
func TestReadmeWalkthroughs(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "sed"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not found", tool)
			}
			t.Skipf("%s not found; the walkthroughs need it", tool)
		}
	}
	var run []docBlock
	for _, file := range docFiles(t) {
		for _, b := range shellBlocks(t, file) {
			if b.mark == "run" {
				run = append(run, b)
			}
		}
	}
	if !slices.ContainsFunc(run, func(b docBlock) bool { return b.file == "README.md" }) {
		t.Fatal("no block of README.md is marked <!-- doc-test: run -->: its walkthrough is not run")
	}
	bin := testenv.Binary(t, "seckill/cmd/api")
	for _, b := range run {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			runWalkthrough(t, bin, b)
		})
	}
}

// runWalkthrough runs one block against a service of its own.
func runWalkthrough(t *testing.T, bin string, b docBlock) {
	dir := t.TempDir()
	addr := freeAddr(t)
	env := map[string]string{
		"SECKILL_ADDR":       addr,
		"SECKILL_DATA_DIR":   filepath.Join(dir, "seckill-data"),
		"SECKILL_ADMIN_ADDR": "off", // no fixed port shared by parallel tests
	}
	maps.Copy(env, b.env)
	logs := runService(t, env)

	// The block, with its expected outputs turned into separators.
	var script strings.Builder
	var wants []string
	script.WriteString(apiShim)
	for line := range strings.Lines(b.text) {
		if m := expected.FindStringSubmatch(strings.TrimRight(line, "\n")); m != nil {
			wants = append(wants, m[1])
			fmt.Fprintf(&script, "echo '%s'\n", expectSep)
			continue
		}
		line = strings.ReplaceAll(line, "localhost:8080", addr)
		script.WriteString(strings.ReplaceAll(line, "127.0.0.1:8080", addr))
	}
	if len(wants) == 0 {
		t.Fatalf("%s shows no expected output (#   {...})", b)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", "-euo", "pipefail", "-c", script.String())
	cmd.Dir = dir
	cmd.WaitDelay = 5 * time.Second
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SECKILL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "DOC_TEST_API="+bin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	defer func() {
		if t.Failed() {
			t.Logf("the block's stdout:\n%s\nits stderr:\n%s\nthe service's log:\n%s", stdout.String(), stderr.String(), logs())
		}
	}()
	if err != nil {
		t.Fatalf("%s: bash: %v", b, err)
	}
	outs := strings.Split(stdout.String(), expectSep+"\n")
	if len(outs) != len(wants)+1 {
		t.Fatalf("%s: %d outputs for %d expected ones", b, len(outs)-1, len(wants))
	}
	for i, want := range wants {
		if got := strings.TrimSpace(outs[i]); !expectPattern(want).MatchString(got) {
			t.Errorf("%s: output %d is\n  %s\nwant\n  %s", b, i+1, got, want)
		}
	}
	if strings.Contains(b.text, "./cmd/api token") && !strings.Contains(stderr.String(), "signed with the embedded mode's secret in seckill-data/token-secret") {
		t.Errorf("%s: api token did not say which secret signed it on stderr: %q", b, stderr.String())
	}
}
