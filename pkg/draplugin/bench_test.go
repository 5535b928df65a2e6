package draplugin_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpudra/gpudra/internal/lockedfile"
	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/draplugin"
)

// benchFleet is one node with 32 full GPUs, so 32 claims can each hold one.
func benchFleet() string {
	var b strings.Builder
	b.WriteString("nodes:\n- name: bench-0\n  gpus:\n")
	for i := range 32 {
		fmt.Fprintf(&b, "  - {model: H100-SXM5-80GB, pciBusID: \"0000:%02x:00.0\", pcieRoot: pci0000:%02x}\n", i+1, i/2)
	}
	return b.String()
}

// withRunCDIDir puts the CDI directory on tmpfs, as /var/run/cdi is on a
// real node (/run is tmpfs), while the checkpoint stays on disk as
// /var/lib/kubelet/plugins does. Without /dev/shm the disk is used.
func withRunCDIDir(tb testing.TB) func(*draplugin.Config) {
	return func(cfg *draplugin.Config) {
		dir, err := os.MkdirTemp("/dev/shm", "gpudra-cdi")
		if err != nil {
			tb.Logf("no tmpfs for the CDI directory, using the disk: %v", err)
			return
		}
		tb.Cleanup(func() { _ = os.RemoveAll(dir) })
		cfg.CDIDir = dir
	}
}

// benchClaims creates n claims, one GPU each, on the bench node.
func benchClaims(h *harness, n int) []*resourceapi.ResourceClaim {
	claims := make([]*resourceapi.ResourceClaim, n)
	for i := range claims {
		claims[i] = h.claim(fmt.Sprintf("gpu-%d", i))
	}
	return claims
}

func mustOK(b *testing.B, resp *drapb.NodePrepareResourcesResponse) {
	for uid, r := range resp.Claims {
		if r.Error != "" {
			b.Fatalf("claim %s: %s", uid, r.Error)
		}
	}
}

// BenchmarkPrepareOneClaim: one NodePrepareResources call with one
// full-GPU claim, over gRPC, with seven other claims prepared on the node
// (a busy 8-GPU node). Unprepare runs outside the timer. Outside the timer
// too, each iteration does the baseline once, one atomic replace of a file
// of the checkpoint's size next to the checkpoint, exactly as the checkpoint
// does it, so that the ratio is taken under the same disk conditions.
func BenchmarkPrepareOneClaim(b *testing.B) {
	h := newHarness(b, withFleet(b, benchFleet(), "bench-0"), withRunCDIDir(b))
	claims := benchClaims(h, 8)
	for _, c := range claims {
		mustOK(b, h.prepare(c))
	}
	data := []byte(h.checkpoint())
	h.mustUnprepare(claims[0])
	baselinePath := filepath.Join(h.cfg.PluginDataDir, "baseline.json")
	var baseline time.Duration
	b.ResetTimer()
	for b.Loop() {
		mustOK(b, h.prepare(claims[0]))
		b.StopTimer()
		h.mustUnprepare(claims[0])
		start := time.Now()
		if err := lockedfile.Write(baselinePath, data); err != nil {
			b.Fatal(err)
		}
		baseline += time.Since(start)
		b.StartTimer()
	}
	b.StopTimer()
	perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	base := float64(baseline.Nanoseconds()) / float64(b.N)
	b.ReportMetric(base, "baseline-ns/op")
	b.ReportMetric(perOp/base, "x-baseline")
}

// BenchmarkPrepare32Concurrent: 32 concurrent one-claim calls, as the
// kubelet issues them for 32 pods starting at once. One op is all 32.
// Outside the timer each iteration also prepares one claim alone, so that
// "x-one-claim" compares the two under the same conditions.
func BenchmarkPrepare32Concurrent(b *testing.B) {
	h := newHarness(b, withFleet(b, benchFleet(), "bench-0"), withRunCDIDir(b))
	claims := benchClaims(h, 32)
	var writes int64
	var single time.Duration
	b.ResetTimer()
	for b.Loop() {
		before := h.driver.CheckpointWrites()
		var wg sync.WaitGroup
		for _, c := range claims {
			wg.Go(func() { mustOK(b, h.prepare(c)) })
		}
		wg.Wait()
		b.StopTimer()
		writes += h.driver.CheckpointWrites() - before
		h.unprepare(claims...)
		start := time.Now()
		mustOK(b, h.prepare(claims[0]))
		single += time.Since(start)
		h.unprepare(claims[0])
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(writes)/float64(b.N), "checkpoint-writes/op")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(single.Nanoseconds()), "x-one-claim")
}

// BenchmarkPrepareOneCall32Claims: one call carrying 32 claims.
func BenchmarkPrepareOneCall32Claims(b *testing.B) {
	h := newHarness(b, withFleet(b, benchFleet(), "bench-0"), withRunCDIDir(b))
	claims := benchClaims(h, 32)
	var writes int64
	b.ResetTimer()
	for b.Loop() {
		before := h.driver.CheckpointWrites()
		mustOK(b, h.prepare(claims...))
		b.StopTimer()
		writes += h.driver.CheckpointWrites() - before
		h.unprepare(claims...)
		b.StartTimer()
	}
	b.ReportMetric(float64(writes)/float64(b.N), "checkpoint-writes/op")
}

// BenchmarkAtomicReplaceBaseline: the floor under one prepare, one atomic
// replace of a file the size of the checkpoint with eight prepared claims,
// done exactly as the checkpoint does it (lockedfile.Write), in
// the same kind of directory.
func BenchmarkAtomicReplaceBaseline(b *testing.B) {
	h := newHarness(b, withFleet(b, benchFleet(), "bench-0"), withRunCDIDir(b))
	for _, c := range benchClaims(h, 8) {
		mustOK(b, h.prepare(c))
	}
	data := []byte(h.checkpoint())
	b.ReportMetric(float64(len(data)), "checkpoint-bytes")
	path := filepath.Join(shorttemp.Dir(b), "checkpoint.json")
	b.ResetTimer()
	for b.Loop() {
		if err := lockedfile.Write(path, data); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	_ = os.Remove(path)
}

// withRunDataDir puts the plugin's data directory, the checkpoint's, on
// tmpfs too. On a disk the cost of creating a file can depend on how many
// files anyone deleted lately (ext4 without a journal, as on the
// development VM, skips the inodes deleted in the last minutes when it
// allocates one), which a faster loop makes worse for the floor and the
// Prepare alike; on tmpfs only the CPU is measured.
func withRunDataDir(tb testing.TB) func(*draplugin.Config) {
	return func(cfg *draplugin.Config) {
		dir, err := os.MkdirTemp("/dev/shm", "gpudra-data")
		if err != nil {
			tb.Skipf("no tmpfs for the data directory: %v", err)
		}
		tb.Cleanup(func() { _ = os.RemoveAll(dir) })
		cfg.PluginDataDir = dir
	}
}

// checkpointDirs are where the Prepare benchmarks put the checkpoint: on
// the disk, as /var/lib/kubelet/plugins is, and on tmpfs.
var checkpointDirs = []struct {
	name string
	opts func(testing.TB) []func(*draplugin.Config)
}{
	{"checkpoint=disk", func(tb testing.TB) []func(*draplugin.Config) { return []func(*draplugin.Config){withRunCDIDir(tb)} }},
	{"checkpoint=tmpfs", func(tb testing.TB) []func(*draplugin.Config) {
		return []func(*draplugin.Config){withRunCDIDir(tb), withRunDataDir(tb)}
	}},
}

// BenchmarkPrepareOwnWork: gpudra's own work in one Prepare, the plugin's
// PrepareResourceClaims called directly with an already-fetched full-GPU
// claim (no gRPC, no GET of the claim: those every driver pays), seven
// other claims prepared on the node. Unprepare runs outside the timer, and
// so does, each iteration, the floor: the writes a Prepare cannot do
// without, one atomic replace of the claim's CDI spec and one of the
// checkpoint, with the same bytes in the same directories. "x-floor" is the
// ratio of the two, taken under the same disk conditions; "cpu-x-floor"
// the ratio of the process's CPU time (user and system) in each, which a
// machine busy with other work disturbs less than wall time. The
// checkpoint is on the disk, then on tmpfs (checkpointDirs).
func BenchmarkPrepareOwnWork(b *testing.B) {
	for _, d := range checkpointDirs {
		b.Run(d.name, func(b *testing.B) { benchPrepareOwnWork(b, d.opts(b)...) })
	}
}

func benchPrepareOwnWork(b *testing.B, opts ...func(*draplugin.Config)) {
	h := newHarness(b, append([]func(*draplugin.Config){withFleet(b, benchFleet(), "bench-0")}, opts...)...)
	claims := benchClaims(h, 8)
	for _, c := range claims {
		mustOK(b, h.prepare(c))
	}
	floor := newPrepareFloor(b, h, claims[0])
	h.mustUnprepare(claims[0])
	one := claims[:1]
	unprepare := []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: claims[0].Namespace, Name: claims[0].Name}, UID: claims[0].UID}}
	var floorTime, floorCPU, ownCPU time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		cpu := processCPU(b)
		res, err := h.driver.PrepareResourceClaims(h.ctx, one)
		if err != nil || res[claims[0].UID].Err != nil {
			b.Fatalf("prepare: %v %v", err, res[claims[0].UID].Err)
		}
		b.StopTimer()
		ownCPU += processCPU(b) - cpu
		if res, err := h.driver.UnprepareResourceClaims(h.ctx, unprepare); err != nil || res[claims[0].UID] != nil {
			b.Fatalf("unprepare: %v %v", err, res[claims[0].UID])
		}
		start, cpu := time.Now(), processCPU(b)
		floor.write(b)
		floorTime += time.Since(start)
		floorCPU += processCPU(b) - cpu
		b.StartTimer()
	}
	b.StopTimer()
	perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	base := float64(floorTime.Nanoseconds()) / float64(b.N)
	b.ReportMetric(base, "floor-ns/op")
	b.ReportMetric(perOp/base, "x-floor")
	b.ReportMetric(float64(ownCPU.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(ownCPU)/float64(floorCPU), "cpu-x-floor")
}

// processCPU is the CPU time, user and system, the process has used: the
// committer's goroutine does part of a Prepare's work.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPrepareWritesFloor: the floor of BenchmarkPrepareOwnWork alone,
// one atomic replace of a claim's CDI spec (tmpfs, as /var/run/cdi) and one
// of the checkpoint with eight claims (disk, then tmpfs), no fsync.
func BenchmarkPrepareWritesFloor(b *testing.B) {
	for _, d := range checkpointDirs {
		b.Run(d.name, func(b *testing.B) { benchPrepareWritesFloor(b, d.opts(b)...) })
	}
}

func benchPrepareWritesFloor(b *testing.B, opts ...func(*draplugin.Config)) {
	h := newHarness(b, append([]func(*draplugin.Config){withFleet(b, benchFleet(), "bench-0")}, opts...)...)
	claims := benchClaims(h, 8)
	for _, c := range claims {
		mustOK(b, h.prepare(c))
	}
	floor := newPrepareFloor(b, h, claims[0])
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		floor.write(b)
	}
	b.ReportMetric(float64(len(floor.spec)), "spec-bytes")
	b.ReportMetric(float64(len(floor.checkpoint)), "checkpoint-bytes")
}

// prepareFloor is the I/O a Prepare of one claim cannot do without: the
// claim's CDI spec and the checkpoint, each replaced atomically, next to
// the real files.
type prepareFloor struct {
	spec, checkpoint         []byte
	specPath, checkpointPath string
}

// newPrepareFloor takes the bytes of claim's spec and of the checkpoint
// as they are with claim prepared.
func newPrepareFloor(b *testing.B, h *harness, claim *resourceapi.ResourceClaim) *prepareFloor {
	b.Helper()
	specs, err := filepath.Glob(filepath.Join(h.cfg.CDIDir, "*"+string(claim.UID)+".json"))
	if err != nil || len(specs) != 1 {
		b.Fatalf("the CDI spec of claim %s: %v %v", claim.UID, specs, err)
	}
	spec, err := os.ReadFile(specs[0])
	if err != nil {
		b.Fatal(err)
	}
	return &prepareFloor{
		spec:           spec,
		checkpoint:     []byte(h.checkpoint()),
		specPath:       filepath.Join(h.cfg.CDIDir, "floor.json"),
		checkpointPath: filepath.Join(h.cfg.PluginDataDir, "floor-checkpoint.json"),
	}
}

func (f *prepareFloor) write(b *testing.B) {
	if err := lockedfile.Write(f.specPath, f.spec); err != nil {
		b.Fatal(err)
	}
	if err := lockedfile.Write(f.checkpointPath, f.checkpoint); err != nil {
		b.Fatal(err)
	}
}
