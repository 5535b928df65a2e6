package imagebuild

import (
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// WriteLayout replaces dir with an OCI image layout holding img, tagged
// ref (the org.opencontainers.image.ref.name annotation carries the tag).
func WriteLayout(dir string, img v1.Image, ref string) error {
	return writeLayout(dir, ref, func(p layout.Path, opts ...layout.Option) error {
		return p.AppendImage(img, opts...)
	})
}

// WriteIndexLayout replaces dir with an OCI image layout holding the
// multi-platform image idx ([Index]), tagged ref: the layout's index.json
// names idx, which names an image per platform.
func WriteIndexLayout(dir string, idx v1.ImageIndex, ref string) error {
	return writeLayout(dir, ref, func(p layout.Path, opts ...layout.Option) error {
		return p.AppendIndex(idx, opts...)
	})
}

func writeLayout(dir, ref string, appendTo func(layout.Path, ...layout.Option) error) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	if err := appendTo(p, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(),
		"io.containerd.image.name":          tag.Name(),
	})); err != nil {
		return fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	return nil
}

// WriteArchive writes img tagged ref as a `docker save`-style archive,
// which `docker load`, `kind load image-archive` and `ctr image import`
// read.
func WriteArchive(file string, img v1.Image, ref string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		return fmt.Errorf("image archive %s: %w", file, err)
	}
	return nil
}

// CompressedSize is what pulling img transfers: its manifest, config and
// compressed layers.
func CompressedSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	size := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return size, nil
}
