package featuretest_test

import (
	"encoding/json"
	"testing"

	"github.com/gpudra/gpudra/internal/featuretest"
	"github.com/gpudra/gpudra/pkg/features/dynamicmig"
	mpsfeature "github.com/gpudra/gpudra/pkg/features/mps"
	"github.com/gpudra/gpudra/pkg/features/timeslicing"
	vfiofeature "github.com/gpudra/gpudra/pkg/features/vfio"
)

// fixedSeeds is how many seeds Seeds adds after the records and their
// halves: the wrong JSON types, null, empty.
const fixedSeeds = 5

// rewrite decodes rec as the configurator's record type T and encodes it
// again, as the configurator writes its records.
func rewrite[T any](rec []byte) ([]byte, error) {
	var v T
	if err := json.Unmarshal(rec, &v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// TestSeedsHoldCommittedRecords: each record name a feature's fuzz test
// seeds from the committed example checkpoints is held by one of them, in
// exactly the form that configurator writes, so that removing or changing
// a fixture cannot leave a fuzz test with only its hand-made seeds.
func TestSeedsHoldCommittedRecords(t *testing.T) {
	for name, rewrite := range map[string]func([]byte) ([]byte, error){
		dynamicmig.Name:  rewrite[dynamicmig.Record],
		mpsfeature.Name:  rewrite[mpsfeature.Record],
		timeslicing.Name: rewrite[timeslicing.Record],
		vfiofeature.Name: rewrite[vfiofeature.Record],
	} {
		t.Run(name, func(t *testing.T) {
			seeds := featuretest.Seeds(t, name)
			// Each record comes with its first half.
			records := seeds[:(len(seeds)-fixedSeeds)/2]
			if len(records) == 0 {
				t.Fatalf("no committed checkpoint holds a %s record", name)
			}
			for _, rec := range records {
				again, err := rewrite(rec)
				if err != nil || string(again) != string(rec) {
					t.Errorf("committed %s record %s is not as its configurator writes it: %s (%v)", name, rec, again, err)
				}
			}
		})
	}
}
