package checkpoint

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpudra/gpudra/internal/lockedfile"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

// benchState is a realistic checkpoint: 8 prepared claims on an 8-GPU node,
// whole GPUs and MIG devices, one or two consumers each.
func benchState() *claimstate.State {
	st := claimstate.New()
	for i := range 8 {
		uid := fmt.Sprintf("6f1c2d3e-4a5b-4c6d-8e7f-%012d", i)
		c := &claimstate.Claim{
			UID:       uid,
			Namespace: "team-" + fmt.Sprint(i%3),
			Name:      fmt.Sprintf("training-job-%d-gpu-claim", i),
			Phase:     claimstate.PrepareCompleted,
			StartedAt: time.Date(2026, 11, 22, 10, i, 0, 0, time.UTC),
			Consumers: []claimstate.Consumer{{Name: fmt.Sprintf("training-job-%d-worker-0", i), UID: fmt.Sprintf("0a1b2c3d-4e5f-4a6b-8c7d-%012d", i)}},
		}
		if i%2 == 0 {
			c.Devices = []claimstate.Device{{
				Requests: []string{"gpu"}, Pool: "gpu-node-17", Name: fmt.Sprintf("gpu-%d", i),
				UUID:         fmt.Sprintf("GPU-4f6a1b2c-3d4e-5f60-7182-93a4b5c6d7%02d", i),
				CDIDeviceIDs: []string{fmt.Sprintf("k8s.gpu.nvidia.com/claim=%s-gpu-%d", uid, i)},
			}}
		} else {
			for j := range 2 {
				c.Devices = append(c.Devices, claimstate.Device{
					Requests: []string{"mig"}, Pool: "gpu-node-17", Name: fmt.Sprintf("gpu-%d-mig-1g10gb-19-%d", i, j),
					UUID:         fmt.Sprintf("MIG-8e9f0a1b-2c3d-5e4f-6a7b-8c9d0e1f2a%02d", 10*i+j),
					ParentUUID:   fmt.Sprintf("GPU-4f6a1b2c-3d4e-5f60-7182-93a4b5c6d7%02d", i),
					CDIDeviceIDs: []string{fmt.Sprintf("k8s.gpu.nvidia.com/claim=%s-mig-%d", uid, j)},
				})
			}
			c.Consumers = append(c.Consumers, claimstate.Consumer{Name: fmt.Sprintf("training-job-%d-worker-1", i), UID: fmt.Sprintf("0a1b2c3d-4e5f-4a6b-8c7d-%012d", 100+i)})
		}
		st.Claims[uid] = c
	}
	return st
}

func BenchmarkWriteFile(b *testing.B) {
	data, err := encode("3ee9bf4e-2bc3-4adb-a604-5bd7215f0766", benchState())
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), FileName)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := lockedfile.Write(path, data); err != nil {
			b.Fatal(err)
		}
	}
}

// openBench opens a Store holding benchState.
func openBench(b *testing.B) *Store {
	e := newTestEnv(b)
	s, _ := e.open(b)
	st := benchState()
	if err := s.Update(context.Background(), func(cur *claimstate.State) error {
		cur.Claims = st.Claims
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	return s
}

// touch changes one claim so that every Update really writes.
func touch(n int64) func(*claimstate.State) error {
	return func(st *claimstate.State) error {
		for _, c := range st.Claims {
			c.StartedAt = time.Unix(0, n).UTC()
			return nil
		}
		return nil
	}
}

func BenchmarkUpdate(b *testing.B) {
	s := openBench(b)
	ctx := context.Background()
	var n int64
	writes := s.writes.Load()
	for b.Loop() {
		n++
		if err := s.Update(ctx, touch(n)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(s.writes.Load()-writes)/float64(b.N), "writes/op")
}

func BenchmarkUpdateParallel(b *testing.B) {
	s := openBench(b)
	ctx := context.Background()
	var n atomic.Int64
	writes := s.writes.Load()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := s.Update(ctx, touch(n.Add(1))); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(s.writes.Load()-writes)/float64(b.N), "writes/op")
}

// BenchmarkRead is the fast path: the file is the one the Store wrote.
func BenchmarkRead(b *testing.B) {
	s := openBench(b)
	ctx := context.Background()
	for b.Loop() {
		if _, err := s.Read(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
