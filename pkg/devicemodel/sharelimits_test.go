package devicemodel_test

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpudra/gpudra/pkg/devicemodel"
)

func TestShareLimits(t *testing.T) {
	const mib = 1 << 20
	const h100 = 81559 * mib // the simulated H100's memory
	consumed := func(kv ...string) map[resourceapi.QualifiedName]resource.Quantity {
		out := map[resourceapi.QualifiedName]resource.Quantity{}
		for i := 0; i < len(kv); i += 2 {
			out[resourceapi.QualifiedName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return out
	}
	memCompute := devicemodel.Sharing{Mode: devicemodel.SharingMemoryCompute}
	shares := func(n int) devicemodel.Sharing {
		return devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: n}
	}
	unlimited := devicemodel.Sharing{Mode: devicemodel.SharingUnlimited}
	tests := []struct {
		name     string
		sharing  devicemodel.Sharing
		consumed map[resourceapi.QualifiedName]resource.Quantity
		want     devicemodel.ShareLimits
		wantErr  string
	}{
		{"memory and compute", memCompute, consumed("memory", "20Gi", "compute", "25"), devicemodel.ShareLimits{PinnedMemoryBytes: 20 << 30, ActiveThreadPercentage: 25}, ""},
		{"memory only: compute uncapped", memCompute, consumed("memory", "21380202496", "compute", "0"), devicemodel.ShareLimits{PinnedMemoryBytes: 21380202496}, ""},
		{"defaults: the whole GPU, uncapped", memCompute, consumed("memory", "81559Mi", "compute", "0"), devicemodel.ShareLimits{}, ""},
		{"all compute: SMs uncapped", memCompute, consumed("memory", "1Mi", "compute", "100"), devicemodel.ShareLimits{PinnedMemoryBytes: mib}, ""},
		{"memory missing", memCompute, consumed("compute", "10"), devicemodel.ShareLimits{}, `consumed capacity has no "memory"; was the claim allocated under another sharing mode?`},
		{"compute missing", memCompute, consumed("memory", "1Gi"), devicemodel.ShareLimits{}, `no "compute"`},
		{"memory above the GPU's", memCompute, consumed("memory", "81560Mi", "compute", "0"), devicemodel.ShareLimits{}, "consumed memory 81560Mi is not a whole number from 1048576 to 85520809984"},
		{"memory below 1Mi", memCompute, consumed("memory", "1Ki", "compute", "0"), devicemodel.ShareLimits{}, "consumed memory 1Ki"},
		{"compute above 100", memCompute, consumed("memory", "1Gi", "compute", "101"), devicemodel.ShareLimits{}, "consumed compute 101 is not a whole number from 0 to 100"},
		{"fractional compute", memCompute, consumed("memory", "1Gi", "compute", "500m"), devicemodel.ShareLimits{}, "consumed compute 500m"},

		{"one of four shares", shares(4), consumed("shares", "1", "memory", "0"), devicemodel.ShareLimits{PinnedMemoryBytes: h100 / 4, ActiveThreadPercentage: 25}, ""},
		{"three of four shares", shares(4), consumed("shares", "3", "memory", "0"), devicemodel.ShareLimits{PinnedMemoryBytes: h100 * 3 / 4, ActiveThreadPercentage: 75}, ""},
		{"all shares: the whole GPU, uncapped", shares(4), consumed("shares", "4", "memory", "0"), devicemodel.ShareLimits{}, ""},
		{"one of three: rounded down", shares(3), consumed("shares", "1", "memory", "0"), devicemodel.ShareLimits{PinnedMemoryBytes: h100 / 3, ActiveThreadPercentage: 33}, ""},
		{"one of a hundred", shares(100), consumed("shares", "1", "memory", "0"), devicemodel.ShareLimits{PinnedMemoryBytes: h100 / 100, ActiveThreadPercentage: 1}, ""},
		{"more shares than the GPU has", shares(4), consumed("shares", "5", "memory", "0"), devicemodel.ShareLimits{}, "consumed shares 5 is not a whole number from 1 to 4"},
		{"memory consumed with shares", shares(4), consumed("shares", "1", "memory", "1Gi"), devicemodel.ShareLimits{}, "consumed memory 1Gi is not a whole number from 0 to 0"},
		{"shares missing: allocated by memory", shares(4), consumed("memory", "1Gi", "compute", "0"), devicemodel.ShareLimits{}, `no "shares"`},

		{"unlimited, nothing asked", unlimited, consumed("memory", "0"), devicemodel.ShareLimits{}, ""},
		{"unlimited, memory asked", unlimited, consumed("memory", "8Gi"), devicemodel.ShareLimits{PinnedMemoryBytes: 8 << 30}, ""},
		{"unlimited, less than MPS takes", unlimited, consumed("memory", "1"), devicemodel.ShareLimits{PinnedMemoryBytes: mib}, ""},
		{"not shared", devicemodel.Sharing{}, consumed("memory", "0"), devicemodel.ShareLimits{}, "device gpu-0: not published for sharing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := devicemodel.Build(inventoryOf(simGPU(t, 0, "H100-SXM5-80GB", false)), devicemodel.WithSharing(tt.sharing))
			if err != nil {
				t.Fatal(err)
			}
			got, err := m.Devices[0].ShareLimits(tt.consumed)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("= %+v, want %+v", got, tt.want)
			}
		})
	}
}
