package install

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// chartFileSources are the chart's files/ directories and the repository
// directories they are copies of (`make chart-files` copies them): the one
// source of the CRDs, DeviceClasses and RBAC, which the local cluster
// installs and the Go tests check.
var chartFileSources = map[string]string{
	"files/crds":          "deployments/crds",
	"files/deviceclasses": "deployments/deviceclasses",
	"files/rbac":          "deployments/rbac",
}

// TestChartHasNoSymlinks: helm warns about every symbolic link in a chart
// at every command, and a packaged chart (helm package, an OCI push) is
// only right if the links resolve where it is built. The chart ships
// plain files.
func TestChartHasNoSymlinks(t *testing.T) {
	err := filepath.WalkDir(ChartDir(), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			rel, _ := filepath.Rel(ChartDir(), path)
			t.Errorf("the chart has a symbolic link %s; helm warns about it at every command: copy its target instead (make chart-files)", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestChartFilesAreCopiesOfTheirSources: each YAML file of a source
// directory has an identical copy under the chart's files/, and files/ has
// nothing else, so the chart cannot drift from the objects the local
// cluster installs and the Go tests check.
func TestChartFilesAreCopiesOfTheirSources(t *testing.T) {
	repo := filepath.Join(ChartDir(), "..", "..", "..")
	for _, copyDir := range slices.Sorted(func(yield func(string) bool) {
		for k := range chartFileSources {
			if !yield(k) {
				return
			}
		}
	}) {
		source := filepath.Join(repo, chartFileSources[copyDir])
		want := yamlFiles(t, source)
		got := yamlFiles(t, filepath.Join(ChartDir(), copyDir))
		if len(want) == 0 {
			t.Fatalf("%s has no YAML files", chartFileSources[copyDir])
		}
		for name, text := range want {
			copied, ok := got[name]
			switch {
			case !ok:
				t.Errorf("%s/%s has no copy in the chart's %s: run make chart-files", chartFileSources[copyDir], name, copyDir)
			case !bytes.Equal(copied, text):
				t.Errorf("the chart's %s/%s differs from %s/%s: run make chart-files", copyDir, name, chartFileSources[copyDir], name)
			}
		}
		for name := range got {
			if _, ok := want[name]; !ok {
				t.Errorf("the chart's %s/%s has no source in %s: remove it, or run make chart-files", copyDir, name, chartFileSources[copyDir])
			}
		}
	}
}

// yamlFiles returns the YAML files under dir by their slash-separated
// paths relative to it; none when dir does not exist.
func yamlFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		files[filepath.ToSlash(rel)] = text
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return files
}
