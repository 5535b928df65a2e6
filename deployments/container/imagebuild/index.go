package imagebuild

import (
	"fmt"
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Index returns an OCI image index of images, one per platform: a
// multi-platform image, from which a container runtime pulls the image of
// its node's platform. Each descriptor's platform is its image's (the OS
// and architecture of its configuration), and the descriptors are ordered
// by platform, so that the same images give the same digest whatever
// their order here. Two images of one platform are an error.
func Index(images ...v1.Image) (v1.ImageIndex, error) {
	if len(images) == 0 {
		return nil, fmt.Errorf("image index: no images")
	}
	type platformImage struct {
		platform v1.Platform
		img      v1.Image
	}
	byPlatform := map[string]platformImage{}
	for _, img := range images {
		p, err := PlatformOf(img)
		if err != nil {
			return nil, err
		}
		key := p.String()
		if _, ok := byPlatform[key]; ok {
			return nil, fmt.Errorf("image index: two images for %s", key)
		}
		byPlatform[key] = platformImage{p, img}
	}
	keys := make([]string, 0, len(byPlatform))
	for k := range byPlatform {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	adds := make([]mutate.IndexAddendum, 0, len(keys))
	for _, k := range keys {
		pi := byPlatform[k]
		adds = append(adds, mutate.IndexAddendum{
			Add:        plainImage{pi.img},
			Descriptor: v1.Descriptor{Platform: &pi.platform},
		})
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	return mutate.AppendManifests(idx, adds...), nil
}

// plainImage is an image that describes itself in an index as an image,
// not an artifact: go-containerregistry gives an image's descriptor its
// config's media type as artifactType, which the OCI image spec reserves
// for artifacts and which docker buildx's indexes leave out.
type plainImage struct{ v1.Image }

// ArtifactType is empty: an image is no artifact.
func (plainImage) ArtifactType() (string, error) { return "", nil }

// PlatformOf is the platform img runs on, from its configuration.
func PlatformOf(img v1.Image) (v1.Platform, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Platform{}, fmt.Errorf("image configuration: %w", err)
	}
	if cf.OS == "" || cf.Architecture == "" {
		return v1.Platform{}, fmt.Errorf("image configuration: no OS or architecture (%q, %q)", cf.OS, cf.Architecture)
	}
	return v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}, nil
}
