package kv

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// The directory at the scale the orchestrator must handle: 256 nodes and
// 10 M block replicas (2,500 chains of 2,000 blocks, each block on two
// nodes, tiers mixed).
const (
	benchNodes       = 256
	benchChainBlocks = 2000
	benchChains      = 2500
)

type benchDir struct {
	d        *Directory
	chains   [][]BlockHash
	seq      []uint64
	heapPer  float64 // bytes of heap per replica
	fillTime time.Duration
}

var (
	benchOnce sync.Once
	bench     *benchDir
)

func splitmix(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func loadBenchDir(b *testing.B) *benchDir {
	benchOnce.Do(func() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		bd := &benchDir{d: NewDirectory(), seq: make([]uint64, benchNodes)}
		for i := 0; i < benchNodes; i++ {
			bd.d.Node(fmt.Sprint("node-", i))
		}
		r := rand.New(rand.NewPCG(7, 8))
		x := uint64(42)
		start := time.Now()
		for c := 0; c < benchChains; c++ {
			chain := make([]BlockHash, benchChainBlocks)
			for i := range chain {
				chain[i] = BlockHash(splitmix(&x))
			}
			bd.chains = append(bd.chains, chain)
			// Two holders per chain, as a prefix each.
			for k := 0; k < 2; k++ {
				n := NodeID(r.IntN(benchNodes))
				tier := Tier(r.IntN(2))
				for _, h := range chain {
					bd.seq[n]++
					bd.d.Apply(n, Event{Seq: bd.seq[n], Kind: BlockStored, Tier: tier, Hash: h})
				}
			}
		}
		bd.fillTime = time.Since(start)
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		bd.heapPer = float64(after.HeapAlloc-before.HeapAlloc) / float64(bd.d.Replicas())
		bench = bd
	})
	if bench.d.Replicas() < 9_900_000 {
		b.Fatalf("directory holds %d replicas", bench.d.Replicas())
	}
	return bench
}

// BenchmarkDirectoryIngest applies KV events to the full directory: each
// operation stores a block on a node and removes another (cache churn).
// Target: >= 2 M events/s on one core.
func BenchmarkDirectoryIngest(b *testing.B) {
	bd := loadBenchDir(b)
	x := uint64(99)
	r := rand.New(rand.NewPCG(9, 10))
	events := make([]Event, 0, 2)
	b.ResetTimer()
	for b.Loop() {
		n := NodeID(r.IntN(benchNodes))
		h := BlockHash(splitmix(&x))
		bd.seq[n]++
		events = append(events[:0], Event{Seq: bd.seq[n], Kind: BlockStored, Tier: TierGPU, Hash: h})
		bd.seq[n]++
		events = append(events, Event{Seq: bd.seq[n], Kind: BlockRemoved, Tier: TierGPU, Hash: h})
		if err := bd.d.ApplyBatch(n, events); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds()/1e6, "M-events/s")
	b.ReportMetric(bd.heapPer, "bytes/replica")
	b.ReportMetric(float64(bd.d.Replicas()*2)/bd.fillTime.Seconds()/1e6/2, "M-events/s-fill")
}

// BenchmarkDirectoryMatch2000 matches 2,000-block chains held in full by
// two nodes (every block walked). Target: p99 under 20 us.
func BenchmarkDirectoryMatch2000(b *testing.B) {
	bd := loadBenchDir(b)
	r := rand.New(rand.NewPCG(11, 12))
	var m Match
	lat := make([]time.Duration, 0, 1<<16)
	bd.d.indexLookups = 0
	b.ResetTimer()
	for b.Loop() {
		chain := bd.chains[r.IntN(len(bd.chains))]
		t := time.Now()
		bd.d.Match(chain, &m)
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(t))
		}
		if m.Cluster != benchChainBlocks {
			b.Fatalf("matched %d blocks", m.Cluster)
		}
	}
	b.ReportMetric(float64(bd.d.indexLookups)/float64(b.N), "index-lookups/op")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-us")
}
