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
// checkpoint this process must not overwrite: one written in a schema
// version newer than this package knows, as after a rollback to an older
// plugin, or one that requires claim records this process does not know
// ([WithKnownRecords]). The Store does not overwrite such a file; see
// [OpenReport.NewerVersion].
var ErrNewerVersion = errors.New("checkpoint has a newer schema version")

// newerVersionError is the error of a file in a version above latestKnown,
// or of one requiring unknown records.
type newerVersionError struct {
	path    string
	version string
	// unknown are the record names the file requires that this process
	// does not know, sorted; nil for a newer version.
	unknown []string
}

func (e *newerVersionError) Error() string {
	const advice = "not overwriting it (roll the plugin forward, or move the file aside to start with no prepared claims)"
	if len(e.unknown) > 0 {
		return fmt.Sprintf("checkpoint %s (schema version %s) holds claim records %s, which this plugin does not know, "+
			"so it could not undo what they describe: %s",
			e.path, e.version, strings.Join(e.unknown, ", "), advice)
	}
	return fmt.Sprintf("checkpoint %s has schema version %q, newer than the versions this plugin reads (%s): %s",
		e.path, e.version, readableVersions, advice)
}

// Is makes errors.Is(err, ErrNewerVersion) hold.
func (e *newerVersionError) Is(target error) bool { return target == ErrNewerVersion }

// decoded is the content of a readable checkpoint file.
type decoded struct {
	state *claimstate.State
	// bootID is "" when the file did not record one (NVIDIA's files
	// without nodeBootID, or an empty bootID): its age then decides.
	bootID string
	// from is the version the file was written in.
	from string
	// poolFilled counts the devices read without a pool that got the
	// schema's.
	poolFilled int
	// nvidia is set when the file was NVIDIA's DRA driver's.
	nvidia *nvidiaDecoded
}

// decode reads v2 and v5, and NVIDIA's DRA driver's files. It returns a
// *newerVersionError for a version above latestKnown or for a file
// requiring records sc does not know; any other error means the content is
// unreadable, a version this package does not read included. Unknown
// fields are ignored in every version.
func (sc schema) decode(data []byte) (decoded, error) {
	if looksLikeNVIDIA(data) {
		return sc.decodeNVIDIA(data)
	}
	if err := truncatedNVIDIA(data); err != nil {
		return decoded{}, err
	}
	// v2 (v5 without records) or v5: parse once.
	var f fileV5
	err := json.Unmarshal(data, &f)
	if err == nil && written(f.Version) {
		if f.Version == versionV2 {
			// Fields of later versions mean nothing in v2.
			f.Requires = nil
			for _, c := range f.Claims {
				if c != nil {
					c.Records = nil
				}
			}
		}
		return sc.fromFile(&f, f.Version)
	}
	// Something else: find the version alone, since a newer version may
	// not even parse as v5.
	var env struct {
		Version string `json:"version"`
	}
	if envErr := json.Unmarshal(data, &env); envErr != nil {
		return decoded{}, envErr
	}
	if written(env.Version) {
		return decoded{}, err
	}
	if n, ok := versionNumber(env.Version); ok && n > latestKnown {
		return decoded{}, &newerVersionError{version: env.Version}
	}
	// Below latestKnown no plugin will come back for the file (the
	// development schemas v1, v3 and v4 were never released), so it is
	// unreadable, not left alone.
	return decoded{}, fmt.Errorf("schema version %q is not one this plugin reads (it reads %s)", env.Version, readableVersions)
}

// fromFile turns a file in v5 shape, read from version from, into its state.
func (sc schema) fromFile(f *fileV5, from string) (decoded, error) {
	if unknown := sc.unknownRecords(f); len(unknown) > 0 {
		return decoded{}, &newerVersionError{version: from, unknown: unknown}
	}
	st, filled, err := sc.fromV5(f)
	if err != nil {
		return decoded{}, err
	}
	return decoded{state: st, bootID: f.BootID, from: from, poolFilled: filled}, nil
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
