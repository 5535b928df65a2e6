package loadrun

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

func TestParseLoadMix(t *testing.T) {
	for _, tc := range []struct {
		in, want, wantErr string
	}{
		{in: "gpu", want: "gpu"},
		{in: "mixed", want: "mixed"},
		{in: "", wantErr: `--mix "": must be one of gpu, mixed`},
		{in: "MIG", wantErr: `--mix "MIG": must be one of gpu, mixed`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseMix(tc.in)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Errorf("ParseMix(%q) = %q, %v; want error %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Errorf("ParseMix(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestLoadMixKinds: the mixed run has exactly a third MIG pods and a tenth
// shares, spread over the creation order (each half of a round has half
// of each kind, within one); the default run only whole GPUs.
func TestLoadMixKinds(t *testing.T) {
	for _, tc := range []struct {
		mix                Mix
		n, mig, share, gpu int
	}{
		{MixGPU, 800, 0, 0, 800},
		{MixMixed, 800, 266, 80, 454},
		{MixMixed, 2000, 666, 200, 1134},
		{MixMixed, 31, 10, 3, 18},
		{MixMixed, 9, 3, 0, 6},
		{MixMixed, 2, 0, 0, 2},
		{MixMixed, 0, 0, 0, 0},
	} {
		t.Run(string(tc.mix), func(t *testing.T) {
			k := tc.mix.kinds(tc.n)
			if len(k) != tc.n || count(k, kindMIG) != tc.mig || count(k, kindShare) != tc.share || count(k, kindGPU) != tc.gpu {
				t.Fatalf("kinds(%d): %d pods, %d MIG, %d share, %d gpu; want %d, %d, %d, %d",
					tc.n, len(k), count(k, kindMIG), count(k, kindShare), count(k, kindGPU), tc.n, tc.mig, tc.share, tc.gpu)
			}
			first := k[:tc.n/2]
			for _, kind := range []podKind{kindMIG, kindShare} {
				if got, all := count(first, kind), count(k, kind); got < all/2-1 || got > all/2+1 {
					t.Errorf("kinds(%d): %d of the %d %s pods in the first half", tc.n, got, all, kind)
				}
			}
		})
	}
}

func TestLoadMixFits(t *testing.T) {
	for _, tc := range []struct {
		mix      Mix
		n, nodes int
		wantErr  string
	}{
		{MixGPU, 800, 100, ""},
		{MixGPU, 801, 100, "--pods 801 is more than the 800 GPUs of 100 nodes"},
		{MixMixed, 800, 100, ""},
		{MixMixed, 8000, 1000, ""},
		// 10 per node: 3.33 MIG of 7, 6.67 whole and shares of 7.
		{MixMixed, 1000, 100, ""},
		{MixMixed, 1100, 100, "--pods 1100 with --mix mixed: 734 whole-GPU and share pods is more than the 700 non-MIG GPUs of 100 nodes"},
		{MixMixed, 30, 1, "--pods 30 with --mix mixed: 10 MIG pods is more than the 7 1g.10gb placements of 1 nodes"},
	} {
		t.Run(string(tc.mix), func(t *testing.T) {
			err := tc.mix.fits(tc.n, tc.nodes)
			if (err == nil) != (tc.wantErr == "") || (err != nil && err.Error() != tc.wantErr) {
				t.Errorf("fits(%d, %d) = %v; want %q", tc.n, tc.nodes, err, tc.wantErr)
			}
		})
	}
}

// TestMixedFleetLayout builds gpudra's device model of a node of each
// fleet, as its plugin does (dynamic MIG, the node's sharing), and checks
// that it offers what fits counts on: the mixed node loadMIGPerGPU
// placements of loadMIGProfile on each of loadMIGGPUs GPUs and
// loadWholeGPUs shared whole GPUs, every device consuming its GPU's
// counters; the default node eight unshared GPUs.
func TestMixedFleetLayout(t *testing.T) {
	for _, tc := range []struct {
		mix                  Mix
		whole, migPlacements int
		shared               bool
	}{
		{MixGPU, 8, 0, false},
		{MixMixed, loadWholeGPUs, loadMIGGPUs * loadMIGPerGPU, true},
	} {
		t.Run(string(tc.mix), func(t *testing.T) {
			fleet, err := tc.mix.fleet(2, "")
			if err != nil {
				t.Fatal(err)
			}
			node := &fleet.Nodes[1]
			inv, err := node.Hardware().Discover(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			sharing, err := node.GPUSharing()
			if err != nil {
				t.Fatal(err)
			}
			model, err := devicemodel.Build(inv, devicemodel.WithDynamicMIG(), devicemodel.WithSharing(sharing))
			if err != nil {
				t.Fatal(err)
			}
			whole, placements := 0, 0
			for _, d := range model.Devices {
				if len(d.API.ConsumesCounters) != 1 {
					t.Errorf("device %s consumes %d counter sets, want its GPU's", d.API.Name, len(d.API.ConsumesCounters))
				}
				switch {
				case d.Kind == devicemodel.KindGPU:
					whole++
					if shared := d.API.AllowMultipleAllocations != nil && *d.API.AllowMultipleAllocations; shared != tc.shared {
						t.Errorf("GPU %s shared %v, want %v", d.API.Name, shared, tc.shared)
					}
				case d.Kind == devicemodel.KindMIG && loadMIGName.MatchString(d.API.Name):
					placements++
					if p := d.API.Attributes["profile"].StringValue; p == nil || *p != loadMIGProfile {
						t.Errorf("device %s has profile %v, want %s", d.API.Name, p, loadMIGProfile)
					}
				}
			}
			if whole != tc.whole || placements != tc.migPlacements {
				t.Errorf("%d whole GPUs and %d %s placements; want %d and %d", whole, placements, loadMIGProfile, tc.whole, tc.migPlacements)
			}
		})
	}
}

// TestLoadRequest checks the claim shapes of the three kinds, for both
// drivers' classes.
func TestLoadRequest(t *testing.T) {
	for _, tc := range []struct {
		kind      podKind
		wantClass string
		wantCEL   string
		wantMem   string
	}{
		{kind: kindGPU, wantClass: "gpu.nvidia.com"},
		{kind: kindMIG, wantClass: "mig.nvidia.com", wantCEL: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"},
		{kind: kindShare, wantClass: "gpu.nvidia.com", wantMem: "0"},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			r := loadRequest(tc.kind, "gpu.nvidia.com", "gpu.nvidia.com", gpudraMIGClass)
			e := r.Exactly
			if e == nil || e.DeviceClassName != tc.wantClass || e.Count != 0 {
				t.Fatalf("request %+v; want class %s, one device", r, tc.wantClass)
			}
			var cel string
			if len(e.Selectors) == 1 {
				cel = e.Selectors[0].CEL.Expression
			}
			if cel != tc.wantCEL || (tc.wantCEL == "" && len(e.Selectors) != 0) {
				t.Errorf("selectors %+v; want %q", e.Selectors, tc.wantCEL)
			}
			var mem string
			if e.Capacity != nil {
				q := e.Capacity.Requests["memory"]
				mem = q.String()
			}
			if mem != tc.wantMem {
				t.Errorf("capacity %+v; want memory %q", e.Capacity, tc.wantMem)
			}
		})
	}
}

func TestCheckBaselineName(t *testing.T) {
	for _, tc := range []struct {
		name, wantErr string
	}{
		{name: "baseline.gpudra.sim"},
		{name: "sim.baseline.gpudra"},
		{name: "gpu.nvidia.com", wantErr: `--baseline-driver "gpu.nvidia.com": must differ from gpudra's driver name`},
		{name: "Baseline", wantErr: `--baseline-driver "Baseline": must be a DNS subdomain (a DRA driver name): `},
		{name: "", wantErr: `--baseline-driver "": must be a DNS subdomain (a DRA driver name): `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkBaselineName(tc.name)
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.HasPrefix(err.Error(), tc.wantErr)) {
				t.Errorf("checkBaselineName(%q) = %v; want %q", tc.name, err, tc.wantErr)
			}
		})
	}
}

// TestMIGModeFleet: --mig-mode sets every node's plugin settings, and
// is refused where it would mean nothing.
func TestMIGModeFleet(t *testing.T) {
	for mode, want := range map[string]simfleet.PluginSettings{
		"":             {},
		MIGModeDynamic: {MIGMode: "dynamic", MIGModeSwitching: true},
		MIGModeStatic:  {MIGMode: "static"},
	} {
		fleet, err := MixGPU.fleet(3, mode)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range fleet.Nodes {
			if n.MIGMode != want.MIGMode || n.MIGModeSwitching != want.MIGModeSwitching {
				t.Errorf("--mig-mode %q: node %s has migMode %q, switching %v; want %q, %v", mode, n.Name, n.MIGMode, n.MIGModeSwitching, want.MIGMode, want.MIGModeSwitching)
			}
		}
	}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Pods: 8, Nodes: 1, Mix: "gpu", Rounds: 1, RoundTimeout: time.Minute, MIGMode: "auto"}, `--mig-mode "auto": must be dynamic or static`},
		{Options{Pods: 8, Nodes: 2, Mix: "mixed", Rounds: 1, RoundTimeout: time.Minute, MIGMode: "static"}, "only with --mix gpu"},
	} {
		if _, err := Run(context.Background(), tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error containing %q", tc.o, err, tc.want)
		}
	}
}
