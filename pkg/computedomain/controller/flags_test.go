package controller

import (
	"strings"
	"testing"
	"time"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, f *Flags)
	}{
		{
			name: "defaults",
			check: func(t *testing.T, f *Flags) {
				if !f.LeaderElect || f.LeaseName != DefaultLeaseName || f.LeaseNamespace != "kube-system" || f.MaxChannels <= 0 {
					t.Errorf("defaults %+v", f)
				}
			},
		},
		{
			name: "the chart's arguments",
			args: []string{"--max-channels=128", "--resync-interval=1h", "--clique-namespace=gpudra", "--leader-elect=true",
				"--leader-election-id=cd", "--leader-election-namespace=gpudra", "--leader-election-lease-duration=30s",
				"--leader-election-renew-deadline=20s", "--leader-election-retry-period=4s", "--kube-api-qps=7.5", "--kube-api-burst=9",
				"--v=6", "--logging-format=json"},
			check: func(t *testing.T, f *Flags) {
				if f.MaxChannels != 128 || f.Resync != time.Hour || f.CliqueNamespace != "gpudra" || f.LeaseName != "cd" ||
					f.LeaseNamespace != "gpudra" || f.LeaseDuration != 30*time.Second || f.KubeAPIQPS != 7.5 || f.KubeAPIBurst != 9 {
					t.Errorf("parsed %+v", f)
				}
			},
		},
		{name: "unknown flag", args: []string{"--leader-election-idd=x"}, wantErr: "unknown flag: --leader-election-idd"},
		{name: "argument", args: []string{"extra"}, wantErr: "unexpected arguments"},
		{name: "no channels", args: []string{"--max-channels=0"}, wantErr: "--max-channels 0"},
		{name: "renew deadline beyond the lease", args: []string{"--leader-election-renew-deadline=20s"}, wantErr: "--leader-election-renew-deadline 20s"},
		{name: "retry too close to the renew deadline", args: []string{"--leader-election-retry-period=9s"}, wantErr: "--leader-election-retry-period 9s"},
		{name: "durations unchecked without leader election", args: []string{"--leader-elect=false", "--leader-election-renew-deadline=20s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", "")
			f, err := ParseFlags(tc.args)
			if err == nil {
				err = f.Validate()
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, f)
			}
		})
	}
}
