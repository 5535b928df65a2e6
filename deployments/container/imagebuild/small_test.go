package imagebuild_test

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/deployments/container/imagebuild"
)

// TestBuildSmall builds small images from this test's own binary and
// checks the layer's entries and the configuration, and that bad options
// are refused with an error naming the path.
func TestBuildSmall(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	created := time.Unix(1700000000, 0).UTC()
	tests := []struct {
		name      string
		opts      imagebuild.SmallOptions
		wantErr   string
		wantFiles map[string]byte // path in the layer -> tar type
	}{
		{
			name: "program and links",
			opts: imagebuild.SmallOptions{
				Programs:   map[string]string{"/bin/prog": self},
				Links:      map[string]string{"/bin/sh": "prog", "/usr/bin/env": "/bin/prog"},
				Entrypoint: []string{"/bin/prog"},
				Cmd:        []string{"-test.v"},
				Created:    created,
			},
			wantFiles: map[string]byte{
				"bin/prog": tar.TypeReg, "bin/sh": tar.TypeSymlink, "usr/bin/env": tar.TypeSymlink,
				"etc/passwd": tar.TypeReg, "tmp": tar.TypeDir,
			},
		},
		{name: "no programs", opts: imagebuild.SmallOptions{Created: created}, wantErr: "no programs"},
		{name: "relative program path", opts: imagebuild.SmallOptions{Programs: map[string]string{"bin/prog": self}}, wantErr: `"bin/prog" is not absolute`},
		{name: "missing host file", opts: imagebuild.SmallOptions{Programs: map[string]string{"/bin/prog": "/nonexistent/prog"}}, wantErr: "program /bin/prog"},
		{name: "link over a program", opts: imagebuild.SmallOptions{
			Programs: map[string]string{"/bin/prog": self},
			Links:    map[string]string{"/bin/prog": "sh"},
		}, wantErr: "link /bin/prog: the path is also a program"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			img, err := imagebuild.BuildSmall(tc.opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cf.Config.Entrypoint, tc.opts.Entrypoint) || !slices.Equal(cf.Config.Cmd, tc.opts.Cmd) {
				t.Errorf("entrypoint %q cmd %q, want %q %q", cf.Config.Entrypoint, cf.Config.Cmd, tc.opts.Entrypoint, tc.opts.Cmd)
			}
			if !slices.Equal(cf.Config.Env, []string{imagebuild.PathEnv}) {
				t.Errorf("env %q, want the default PATH", cf.Config.Env)
			}
			layers, err := img.Layers()
			if err != nil || len(layers) != 1 {
				t.Fatalf("layers %d, %v; want 1", len(layers), err)
			}
			rc, err := layers[0].Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			got := map[string]*tar.Header{}
			tr := tar.NewReader(rc)
			for {
				hdr, err := tr.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got[strings.TrimSuffix(hdr.Name, "/")] = hdr
			}
			for p, typ := range tc.wantFiles {
				hdr, ok := got[p]
				if !ok {
					t.Errorf("layer lacks %s", p)
					continue
				}
				if hdr.Typeflag != typ {
					t.Errorf("%s: tar type %q, want %q", p, hdr.Typeflag, typ)
				}
				if !hdr.ModTime.Equal(created) {
					t.Errorf("%s: mtime %v, want %v", p, hdr.ModTime, created)
				}
			}
			for link, target := range tc.opts.Links {
				if hdr := got[strings.TrimPrefix(link, "/")]; hdr != nil && hdr.Linkname != target {
					t.Errorf("%s links to %q, want %q", link, hdr.Linkname, target)
				}
			}
		})
	}
}
