package docstest

import (
	"bufio"
	"bytes"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the repository's root, seen from this package.
const repoRoot = "../.."

var (
	// inlineLink matches [text](target) and ![alt](target), with an
	// optional title after the target.
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// referenceDef matches a reference-style link definition: [name]: target.
	referenceDef = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+(\S+)`)
	// htmlAnchor matches an explicit anchor: <a name="x"> or id="x".
	htmlAnchor = regexp.MustCompile(`(?:name|id)="([^"]+)"`)
	// codeSpan matches inline code, whose brackets are no links.
	codeSpan = regexp.MustCompile("`[^`]*`")
	// headingLink matches a link inside a heading, whose text is the anchor's.
	headingLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// skipDir reports whether a folder holds no documentation of the
// repository's own: git's, build outputs, downloaded sources.
func skipDir(name string) bool {
	return strings.HasPrefix(name, ".") || name == "bin" || name == "_output" || name == "node_modules" || name == "vendor"
}

// markdownFiles lists every .md file under root.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// doc is what the test needs of one Markdown file.
type doc struct {
	links   []link
	anchors map[string]bool
}

// link is one relative link and the line it is on.
type link struct {
	target string
	line   int
}

// parse reads a Markdown file's links and the anchors its headings make,
// skipping fenced code blocks.
func parse(data []byte) doc {
	d := doc{anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	s := bufio.NewScanner(bytes.NewReader(data))
	s.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; s.Scan(); n++ {
		line := s.Text()
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if strings.HasPrefix(line, "#") {
			text := strings.TrimSpace(strings.TrimLeft(line, "#"))
			slug := slugify(text)
			if k := seen[slug]; k > 0 {
				d.anchors[slug+"-"+itoa(k)] = true
			} else {
				d.anchors[slug] = true
			}
			seen[slug]++
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			d.anchors[m[1]] = true
		}
		plain := codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(plain, -1) {
			d.links = append(d.links, link{m[1], n})
		}
		if m := referenceDef.FindStringSubmatch(plain); m != nil {
			d.links = append(d.links, link{m[1], n})
		}
	}
	return d
}

// slugify is the anchor GitHub gives a heading: its text lower-cased,
// punctuation but hyphens and underscores removed, spaces made hyphens.
func slugify(heading string) string {
	heading = headingLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// TestMarkdownLinksResolve fails on a relative link in any Markdown file of
// the repository whose target does not exist, or whose #anchor names no
// heading of the Markdown file it points into.
func TestMarkdownLinksResolve(t *testing.T) {
	files := markdownFiles(t, repoRoot)
	if len(files) < 20 {
		t.Fatalf("found %d Markdown files under %s; the walk no longer finds the docs", len(files), repoRoot)
	}
	docs := map[string]doc{}
	load := func(path string) (doc, error) {
		if d, ok := docs[path]; ok {
			return d, nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return doc{}, err
		}
		d := parse(data)
		docs[path] = d
		return d, nil
	}
	checked := 0
	for _, file := range files {
		d, err := load(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(repoRoot, file)
		for _, l := range d.links {
			u, err := url.Parse(l.target)
			if err != nil {
				t.Errorf("%s:%d: link %q does not parse: %v", rel, l.line, l.target, err)
				continue
			}
			if u.Scheme != "" || u.Host != "" || strings.HasPrefix(u.Path, "/") {
				continue
			}
			checked++
			target := file
			if u.Path != "" {
				target = filepath.Join(filepath.Dir(file), filepath.FromSlash(u.Path))
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", rel, l.line, l.target, u.Path)
					continue
				}
			}
			if u.Fragment == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			td, err := load(target)
			if err != nil {
				t.Errorf("%s:%d: link %q: %v", rel, l.line, l.target, err)
				continue
			}
			if !td.anchors[u.Fragment] {
				t.Errorf("%s:%d: link %q: no heading makes the anchor #%s", rel, l.line, l.target, u.Fragment)
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d relative links; the parser no longer finds them", checked)
	}
}

// TestSlugify pins the anchors GitHub makes of the headings these docs use.
func TestSlugify(t *testing.T) {
	for heading, want := range map[string]string{
		"Values and the plugin's flags":          "values-and-the-plugins-flags",
		"`gpudra kubelet-plugin`":                "gpudra-kubelet-plugin",
		"1. Build and push the image":            "1-build-and-push-the-image",
		"Sharing one process, several processes": "sharing-one-process-several-processes",
		"The [index](README.md) of pages":        "the-index-of-pages",
	} {
		if got := slugify(heading); got != want {
			t.Errorf("slugify(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestDocsIndexReachesEveryPage: every Markdown page under docs/ can be
// reached from docs/README.md by following links, so no page is lost when
// one moves.
func TestDocsIndexReachesEveryPage(t *testing.T) {
	docsDir := filepath.Join(repoRoot, "docs")
	index := filepath.Join(docsDir, "README.md")
	reached := map[string]bool{index: true}
	queue := []string{index}
	for len(queue) > 0 {
		file := queue[0]
		queue = queue[1:]
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range parse(data).links {
			u, err := url.Parse(l.target)
			if err != nil || u.Scheme != "" || u.Host != "" || !strings.HasSuffix(u.Path, ".md") {
				continue
			}
			target := filepath.Join(filepath.Dir(file), filepath.FromSlash(u.Path))
			if reached[target] || !strings.HasPrefix(target, docsDir+string(filepath.Separator)) {
				continue
			}
			if _, err := os.Stat(target); err != nil {
				continue // TestMarkdownLinksResolve reports it
			}
			reached[target] = true
			queue = append(queue, target)
		}
	}
	for _, file := range markdownFiles(t, docsDir) {
		if !reached[file] {
			rel, _ := filepath.Rel(repoRoot, file)
			t.Errorf("%s: no link leads to it from docs/README.md", rel)
		}
	}
}
