// Package docstest holds the test that keeps the repository's Markdown
// links working: every relative link of every .md file must name a file
// that exists and, where it names a heading of a Markdown file, a heading
// that file has. Docs move between folders; the test catches the links a
// move leaves behind.
package docstest
