package draplugin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/runtime/schema"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// metadataVersions are the versions each metadata file holds, newest
// first. v1beta1 is the latest the helper knows, and the helper refuses to
// start without its latest; v1alpha1 readers are not served because none
// shipped with a release of gpudra.
var metadataVersions = []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}

// deviceMetadataOptions are the helper's options that write the device
// metadata (KEP-5304): one file per request of a prepared claim, and a CDI
// spec of kind <driver>/metadata, in the plugin's CDI directory, that
// mounts it into the claim's containers. The helper removes both at
// Unprepare.
func deviceMetadataOptions(cfg *Config) []kubeletplugin.Option {
	if !cfg.DeviceMetadata {
		return nil
	}
	return []kubeletplugin.Option{
		kubeletplugin.EnableDeviceMetadata(true, metadataVersions),
		kubeletplugin.CDIDirectory(cfg.CDIDir),
	}
}

// The helper's layout of the metadata files, which it does not export:
// {pluginDataDir}/dra-device-metadata/{namespace}_{name}/{request}/metadata.json
// and {cdiDir}/{driver}_metadata_{claimUID}_{request}.json.
const metadataSubDir = "dra-device-metadata"

// removeDeviceMetadata removes the helper's metadata files and CDI specs
// of a claim. The helper removes them itself, but only when the kubelet
// unprepares the claim and only while the option is on: a claim the sweep
// releases (its pods and ResourceClaim are gone) is never unprepared, and
// a claim prepared before --device-metadata was turned off is unprepared
// by a helper that no longer knows the files. Either way they would stay
// in the plugin's data directory for good, and their CDI specs with them.
func (d *Driver) removeDeviceMetadata(namespace, name, uid string) error {
	var errs []error
	if namespace != "" && name != "" {
		dir := filepath.Join(d.cfg.PluginDataDir, metadataSubDir, namespace+"_"+name)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove device metadata %s: %w", dir, err))
		}
	}
	specs, err := filepath.Glob(filepath.Join(d.cfg.CDIDir, d.cfg.DriverName+"_metadata_"+uid+"_*.json"))
	if err != nil {
		errs = append(errs, err)
	}
	for _, p := range specs {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove device metadata CDI spec: %w", err))
		}
	}
	return errors.Join(errs...)
}
