package checkpoint

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// A checkpoint.json missing at Open, on a node whose claims' CDI specs say
// claims are prepared, is a loss (crash campaign, defect 1): Open used to
// write an empty checkpoint at once, and a plugin killed before it adopted
// the claims left a valid empty file that the next process trusted. Now the
// loss is in the adopt-pending marker before anything is written.
func TestMissingFileWithEvidenceNeedsAdoption(t *testing.T) {
	cases := []struct {
		name      string
		evidence  func() (string, error)
		wantLoss  bool
		wantInErr string
	}{
		{"no evidence option", nil, false, ""},
		{"nothing prepared", func() (string, error) { return "", nil }, false, ""},
		{"specs found", func() (string, error) { return "2 claims have CDI specs in /cdi", nil }, true, "2 claims have CDI specs"},
		{"evidence unreadable", func() (string, error) { return "", errors.New("permission denied") }, true, "cannot be told (permission denied)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			var opts []Option
			if tc.evidence != nil {
				opts = append(opts, WithLossEvidence(tc.evidence))
			}
			s, report := e.open(t, opts...)
			if !report.Missing {
				t.Errorf("report.Missing = false for a directory without checkpoint.json")
			}
			_, markerErr := os.Stat(filepath.Join(e.dir, AdoptPendingFileName))
			_, fileErr := os.Stat(e.path())
			if !tc.wantLoss {
				if s.NeedsAdoption() || report.Corrupt != nil {
					t.Fatalf("NeedsAdoption = %v, Corrupt = %+v; want a fresh, empty checkpoint", s.NeedsAdoption(), report.Corrupt)
				}
				if fileErr != nil || !errors.Is(markerErr, fs.ErrNotExist) {
					t.Errorf("checkpoint.json: %v, marker: %v; want the file written and no marker", fileErr, markerErr)
				}
				return
			}
			if !s.NeedsAdoption() || report.Corrupt == nil || report.Corrupt.Path != "" {
				t.Fatalf("NeedsAdoption = %v, Corrupt = %+v; want a loss with nothing moved aside", s.NeedsAdoption(), report.Corrupt)
			}
			if !strings.Contains(report.Corrupt.Err.Error(), tc.wantInErr) {
				t.Errorf("Corrupt.Err = %q, want it to contain %q", report.Corrupt.Err, tc.wantInErr)
			}
			// What a kill right now leaves: the marker, and no checkpoint
			// that says "no claims".
			if markerErr != nil {
				t.Errorf("adopt-pending marker: %v, want it written at Open", markerErr)
			}
			if !errors.Is(fileErr, fs.ErrNotExist) {
				t.Errorf("checkpoint.json written before the claims were adopted (stat: %v)", fileErr)
			}
			ctx := context.Background()
			if _, err := s.Read(ctx); !errors.Is(err, ErrNeedsAdoption) {
				t.Errorf("Read before adoption: %v, want ErrNeedsAdoption", err)
			}
			// The next process finds the loss too.
			s2, report2 := e.open(t, opts...)
			if !s2.NeedsAdoption() || report2.Corrupt == nil {
				t.Errorf("a second Open: NeedsAdoption = %v, Corrupt = %+v; want the loss still pending", s2.NeedsAdoption(), report2.Corrupt)
			}
			if err := s.Recover(ctx, func(st *claimstate.State) error {
				st.Adopt("claim-a", []claimstate.Device{{Pool: "node", Name: "gpu-0"}}, nil, time.Now())
				return nil
			}); err != nil {
				t.Fatalf("Recover: %v", err)
			}
			st, err := s2.Read(ctx)
			if err != nil || st.Claims["claim-a"] == nil {
				t.Errorf("after Recover, the other Store reads %v, %v; want the adopted claim", st, err)
			}
		})
	}
}

// A dangling symbolic link at checkpoint.json when the Store opens
// (crash campaign, defect 2): the old missing-file check saw the link, the
// store followed it, found nothing and wrote an empty checkpoint over it.
// It is a path replaced by something gpudra never writes: moved aside as a
// loss.
func TestDanglingLinkAtOpenIsALoss(t *testing.T) {
	e := newTestEnv(t)
	if err := os.Symlink(filepath.Join(e.dir, "elsewhere.json"), e.path()); err != nil {
		t.Fatal(err)
	}
	s, report := e.open(t)
	if report.Missing {
		t.Errorf("report.Missing = true for a link")
	}
	if !s.NeedsAdoption() || report.Corrupt == nil || report.Corrupt.Path == "" {
		t.Fatalf("NeedsAdoption = %v, Corrupt = %+v; want the link moved aside as a loss", s.NeedsAdoption(), report.Corrupt)
	}
	if !strings.Contains(report.Corrupt.Err.Error(), "symbolic link to a missing file") {
		t.Errorf("Corrupt.Err = %q, want it to say what was there", report.Corrupt.Err)
	}
	fi, err := os.Lstat(report.Corrupt.Path)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("moved-aside path %s: %v, %v; want the link kept there", report.Corrupt.Path, fi, err)
	}
	if _, err := os.Lstat(e.path()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("checkpoint.json written before adoption (lstat: %v)", err)
	}
}
