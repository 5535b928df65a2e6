package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// ErrNewerVersion is matched (with errors.Is) by the errors of a Store whose
// checkpoint was written in a schema version newer than this package knows,
// as after a rollback to an older plugin. The Store does not overwrite such
// a file; see [OpenReport.NewerVersion].
var ErrNewerVersion = errors.New("checkpoint has a newer schema version")

// newerVersionError is the error of a file in a version above latestKnown.
type newerVersionError struct {
	path    string
	version string
}

func (e *newerVersionError) Error() string {
	return fmt.Sprintf("checkpoint %s has schema version %q, newer than %s which this plugin writes: "+
		"not overwriting it (roll the plugin forward, or move the file aside to start with no prepared claims)",
		e.path, e.version, currentVersion)
}

// Is makes errors.Is(err, ErrNewerVersion) hold.
func (e *newerVersionError) Is(target error) bool { return target == ErrNewerVersion }

// decoded is the content of a readable checkpoint file.
type decoded struct {
	state *claimstate.State
	// bootID is "" when the version did not record one (v1).
	bootID string
	// from is the version the file was written in.
	from string
}

// decode understands every version up to latestKnown. It returns a
// *newerVersionError for a later version; any other error means the content
// is unreadable. Unknown fields are ignored in every version.
func decode(data []byte) (decoded, error) {
	// v4, v3 (v4 without sharing) or v2 (v3 without dynamicMIG) is the
	// common case: parse once.
	var f fileV3
	err := json.Unmarshal(data, &f)
	if err == nil && written(f.Version) {
		st, err := fromV3(&f)
		return decoded{state: st, bootID: f.BootID, from: f.Version}, err
	}
	// Something else: find the version alone, since a newer version may
	// not even parse as v3.
	var env struct {
		Version string `json:"version"`
	}
	if envErr := json.Unmarshal(data, &env); envErr != nil {
		return decoded{}, envErr
	}
	switch env.Version {
	case versionV1:
		var f1 fileV1
		if err := json.Unmarshal(data, &f1); err != nil {
			return decoded{}, err
		}
		f2, err := migrateV1(&f1)
		if err != nil {
			return decoded{}, fmt.Errorf("migrate from v1: %w", err)
		}
		st, err := fromV3(f2)
		return decoded{state: st, from: versionV1}, err
	case versionV2, versionV3, versionV4:
		return decoded{}, err
	}
	if n, ok := versionNumber(env.Version); ok && n > latestKnown {
		return decoded{}, &newerVersionError{version: env.Version}
	}
	return decoded{}, fmt.Errorf("unknown schema version %q", env.Version)
}

// versionNumber parses "v<N>" with N >= 1 in canonical form.
func versionNumber(v string) (int, bool) {
	digits, ok := strings.CutPrefix(v, "v")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 1 || strconv.Itoa(n) != digits {
		return 0, false
	}
	return n, true
}
