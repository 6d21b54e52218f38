// Package archtest holds the test that keeps imports in the directions
// that docs/architecture.md ("Import directions") draws. It has no code
// of its own.
package archtest
