package routing

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/roles"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const bs = 16

// cluster builds a view and a directory from a compact description.
type cluster struct {
	t   *testing.T
	d   *kv.Directory
	seq map[kv.NodeID]uint64
	v   View
}

func newCluster(t *testing.T) *cluster {
	return &cluster{t: t, d: kv.NewDirectory(), seq: map[kv.NodeID]uint64{}, v: View{BlockSize: bs}}
}

// node adds a node and returns it; the pointer is good until the next node
// is added (use get after that).
func (c *cluster) node(id string, role roles.Role) *Node {
	dir, err := c.d.Node(id)
	if err != nil {
		c.t.Fatal(err)
	}
	c.v.Nodes = append(c.v.Nodes, Node{ID: id, Dir: dir, Role: role, Serving: true, MaxSeqs: 256,
		GPUBlocks: 100000, PrefillSecPerToken: 10e-6, HostSecPerBlock: 20e-6, NetSecPerBlock: 60e-6})
	return &c.v.Nodes[len(c.v.Nodes)-1]
}

func (c *cluster) get(id string) *Node {
	for i := range c.v.Nodes {
		if c.v.Nodes[i].ID == id {
			return &c.v.Nodes[i]
		}
	}
	c.t.Fatalf("no node %s", id)
	return nil
}

// holds stores blocks [from, to) of chain on node id in tier.
func (c *cluster) holds(id string, chain []kv.BlockHash, from, to int, tier kv.Tier) {
	dir, _ := c.d.Node(id)
	for _, h := range chain[from:to] {
		c.seq[dir]++
		if err := c.d.Apply(dir, kv.Event{Seq: c.seq[dir], Kind: kv.BlockStored, Tier: tier, Hash: h}); err != nil {
			c.t.Fatal(err)
		}
	}
}

func (c *cluster) request(id string, tokens int, seed uint32) *Request {
	toks := make([]uint32, tokens)
	for i := range toks {
		toks[i] = seed*7919 + uint32(i)
	}
	chain := kv.ChainHashes(toks, bs)
	r := &Request{ID: id, Tokens: tokens, Chain: chain, MaxTokens: 100, Match: &kv.Match{}}
	c.d.Match(chain, r.Match)
	return r
}

func (c *cluster) rematch(r *Request) { c.d.Match(r.Chain, r.Match) }

// The worked example of dynamo-baseline.md: three workers with prefill and
// decode block costs 8+10, 5+5 and 2+9; the router picks the second.
func TestDynamoWorkedExample(t *testing.T) {
	c := newCluster(t)
	for _, id := range []string{"w1", "w2", "w3"} {
		c.node(id, roles.Decode) // aggregated: one role only
	}
	d := NewDynamo()
	r := c.request("r", 32, 1) // 2 blocks, no overlap, nothing in flight
	for id, st := range map[string]struct{ prefillTokens, activeBlocks int }{
		"w1": {8*bs - 32, 10 - 2}, "w2": {5*bs - 32, 5 - 2}, "w3": {2*bs - 32, 9 - 2},
	} {
		t.Run(id, func(t *testing.T) {
			w := d.worker(id)
			w.activePrefillTokens = float64(st.prefillTokens)
			for i := 0; i < st.activeBlocks; i++ {
				w.activeBlocks[kv.BlockHash(1000+i)] = 1
			}
		})
	}
	for i, n := range c.v.Nodes {
		p, dec, _ := d.costs(&c.v.Nodes[i], r, bs)
		want := map[string][2]float64{"w1": {8, 10}, "w2": {5, 5}, "w3": {2, 9}}[n.ID]
		if p != want[0] || dec != want[1] {
			t.Fatalf("%s: costs %v+%v, want %v", n.ID, p, dec, want)
		}
	}
	dec, err := d.Route(t0, r, &c.v)
	if err != nil || dec.Prefill != "w2" || dec.Decode != "w2" || dec.Disaggregated {
		t.Fatalf("decision %+v %v, want w2 aggregated", dec, err)
	}
}

func TestDynamoCreditsCachedOverlapIncludingHost(t *testing.T) {
	c := newCluster(t)
	c.node("a", roles.Decode)
	c.node("b", roles.Decode)
	r := c.request("r", 1024, 2)
	c.holds("b", r.Chain, 0, 60, kv.TierHost) // KVBM's host tier counts as cached
	c.rematch(r)
	dec, _ := NewDynamo().Route(t0, r, &c.v)
	if dec.Prefill != "b" {
		t.Fatalf("picked %s, want b (60 blocks cached)", dec.Prefill)
	}
}

// A block in a worker's host tier is worth 0.75 of one on its GPU
// (host_cache_hit_weight): 40 blocks on GPU beat 50 on host, 60 on host
// beat 40 on GPU.
func TestDynamoWeighsHostHitsAtThreeQuarters(t *testing.T) {
	for _, tc := range []struct {
		hostBlocks int
		want       string
	}{{50, "gpu"}, {60, "host"}} {
		t.Run(tc.want, func(t *testing.T) {
			c := newCluster(t)
			c.node("gpu", roles.Decode)
			c.node("host", roles.Decode)
			r := c.request("r", 1024, 2)
			c.holds("gpu", r.Chain, 0, 40, kv.TierGPU)
			c.holds("host", r.Chain, 0, tc.hostBlocks, kv.TierHost)
			c.rematch(r)
			d := NewDynamo()
			p, _, overlap := d.costs(c.get("host"), r, bs)
			if want := (1024 - 0.75*float64(tc.hostBlocks)*bs) / bs; p != want || overlap != tc.hostBlocks {
				t.Fatalf("host worker: prefill blocks %v overlap %d, want %v and %d", p, overlap, want, tc.hostBlocks)
			}
			if dec, _ := d.Route(t0, r, &c.v); dec.Prefill != tc.want {
				t.Errorf("%d host blocks against 40 on GPU: picked %s, want %s", tc.hostBlocks, dec.Prefill, tc.want)
			}
		})
	}
}

// Dynamo's router queues once every prefilling worker holds more than 16
// times its token budget in active prefill, and not before; a worker whose
// budget is unknown is never busy.
func TestDynamoBusyPastItsQueueThreshold(t *testing.T) {
	c := newCluster(t)
	for _, id := range []string{"p1", "p2"} {
		c.node(id, roles.Prefill).MaxBatchedTokens = 64
	}
	c.node("d1", roles.Decode).MaxBatchedTokens = 64
	d := NewDynamo()
	if d.Busy(&c.v) {
		t.Fatal("busy with nothing in flight")
	}
	d.worker("p1").activePrefillTokens = 16*64 + 1
	if d.Busy(&c.v) {
		t.Fatal("busy with one prefill worker under the threshold")
	}
	d.worker("p2").activePrefillTokens = 16 * 64
	if d.Busy(&c.v) {
		t.Fatal("busy at the threshold, not past it")
	}
	d.worker("p2").activePrefillTokens++
	if !d.Busy(&c.v) {
		t.Fatal("not busy with every prefill worker past the threshold")
	}
	// The decode pool's load does not count when a prefill pool exists;
	// without budgets nothing is busy.
	c.get("p2").MaxBatchedTokens = 0
	if d.Busy(&c.v) {
		t.Fatal("busy with a worker of unknown budget")
	}
}

// Identical prefixes in a burst see no overlap (no KV event yet) and spread
// by load, as Dynamo's do.
func TestDynamoBurstSpreadsByLoad(t *testing.T) {
	c := newCluster(t)
	for i := 0; i < 4; i++ {
		c.node(fmt.Sprint("w", i), roles.Decode)
	}
	d := NewDynamo()
	used := map[string]int{}
	for i := 0; i < 8; i++ {
		r := c.request(fmt.Sprint("r", i), 2048, 3) // same prompt every time
		dec, _ := d.Route(t0, r, &c.v)
		used[dec.Prefill]++
	}
	// In-flight blocks dedup (depth) pulls repeats to the same worker, while
	// the queued prefill tokens push them apart: both terms count.
	if len(used) < 2 {
		t.Fatalf("a burst of 8 went to %v", used)
	}
}

func TestDynamoBookkeeping(t *testing.T) {
	c := newCluster(t)
	c.node("a", roles.Decode)
	d := NewDynamo()
	r := c.request("r", 320, 4)
	d.Route(t0, r, &c.v)
	w := d.worker("a")
	if w.activePrefillTokens != 320 || len(w.activeBlocks) != 20 {
		t.Fatalf("after routing: %v prefill tokens, %d blocks", w.activePrefillTokens, len(w.activeBlocks))
	}
	d.FirstToken(t0, "r")
	if w.activePrefillTokens != 0 || len(w.activeBlocks) != 20 {
		t.Fatalf("after first token: %v, %d", w.activePrefillTokens, len(w.activeBlocks))
	}
	d.Finished(t0, "r")
	if len(w.activeBlocks) != 0 || len(d.reqs) != 0 {
		t.Fatal("finished request left bookkeeping behind")
	}
}

func TestDynamoDisaggregated(t *testing.T) {
	c := newCluster(t)
	c.node("p1", roles.Prefill)
	c.node("p2", roles.Prefill)
	c.node("d1", roles.Decode)
	c.node("d2", roles.Decode)
	d := NewDynamo()
	r := c.request("r", 1024, 5)
	c.holds("p2", r.Chain, 0, 64, kv.TierGPU)
	c.holds("d2", r.Chain, 0, 64, kv.TierGPU) // decode stage gives no cache credit
	c.rematch(r)
	d.decodeWorkerLoad("d1", 0)
	d.decodeWorkerLoad("d2", 500)
	dec, _ := d.Route(t0, r, &c.v)
	if !dec.Disaggregated || dec.Prefill != "p2" || dec.Decode != "d1" {
		t.Fatalf("decision %+v, want p2 -> d1", dec)
	}
}

func (d *Dynamo) decodeWorkerLoad(id string, blocks int) { d.worker(id).decodeBlocks = blocks }

func TestEvolvePrefersCachedUnlessQueued(t *testing.T) {
	c := newCluster(t)
	c.node("a", roles.Prefill)
	c.node("b", roles.Prefill)
	c.node("d", roles.Decode)
	e := NewEvolve(EvolveConfig{})
	r := c.request("r1", 16*200, 6)
	c.holds("a", r.Chain, 0, 190, kv.TierGPU)
	c.rematch(r)
	dec, err := e.Route(t0, r, &c.v)
	if err != nil || dec.Prefill != "a" || dec.Decode != "d" || !dec.Disaggregated {
		t.Fatalf("cached prefix: %+v %v", dec, err)
	}
	// a now has a long queue: 10 s of prefill waiting. Recomputing 3,200
	// tokens on b (32 ms) beats waiting.
	e.queued["a"] = 10
	r2 := c.request("r2", 16*200, 6)
	dec, _ = e.Route(t0, r2, &c.v)
	if dec.Prefill != "b" {
		t.Fatalf("queued node chosen: %+v", dec)
	}
}

func TestEvolveCountsHostAndPeerBlocks(t *testing.T) {
	c := newCluster(t)
	c.node("a", roles.Prefill)
	c.node("b", roles.Prefill)
	c.node("d", roles.Decode)
	c.node("busy", roles.Decode).Running = 250 // holds the context but decodes a lot
	r := c.request("r", 16*300, 7)
	c.holds("b", r.Chain, 0, 100, kv.TierHost)    // b: its own host tier
	c.holds("busy", r.Chain, 0, 280, kv.TierHost) // a peer's host pool
	c.rematch(r)
	e := NewEvolve(EvolveConfig{})
	dec, err := e.Route(t0, r, &c.v)
	if err != nil {
		t.Fatal(err)
	}
	// b: 100 blocks from its host, 180 pulled from d, 20 blocks recomputed;
	// a: 280 pulled, 20 recomputed. b is cheaper.
	if dec.Prefill != "b" || dec.Decode != "d" || len(dec.Fetches) != 1 {
		t.Fatalf("decision %+v", dec)
	}
	f := dec.Fetches[0]
	if f.To != "b" || f.Src != "busy" || f.From != 100 || f.End != 280 || f.SrcTier != kv.TierHost {
		t.Fatalf("fetch %+v", f)
	}
	// Without the host pools it would recompute 4,800 tokens: 48 ms.
	if dec.EstTTFT >= 48*time.Millisecond {
		t.Fatalf("estimated TTFT %v not below recompute", dec.EstTTFT)
	}
}

func TestEvolveNoFetchWhenRecomputeIsCheaper(t *testing.T) {
	c := newCluster(t)
	c.node("a", roles.Prefill)
	c.node("d", roles.Decode)
	c.node("busy", roles.Decode).Running = 250
	c.get("a").NetSecPerBlock = 1 // a slow network: recompute (160 us a block) wins
	r := c.request("r", 16*100, 8)
	c.holds("busy", r.Chain, 0, 100, kv.TierHost)
	c.rematch(r)
	e := NewEvolve(EvolveConfig{})
	dec, _ := e.Route(t0, r, &c.v)
	if dec.Prefill != "a" || len(dec.Fetches) != 0 {
		t.Fatalf("decision %+v", dec)
	}
}

// vLLM engines keep their own KV: no fetch is planned to one, nor from one.
func TestEvolveFetchesNeitherToNorFromSelfManagedKV(t *testing.T) {
	for i, tc := range []struct{ to, from bool }{{true, false}, {false, true}} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			c := newCluster(t)
			c.node("a", roles.Prefill).SelfManagedKV = tc.to
			c.node("d", roles.Decode)
			c.node("busy", roles.Decode).Running = 250
			c.get("busy").SelfManagedKV = tc.from
			r := c.request("r", 16*300, 9)
			c.holds("busy", r.Chain, 0, 280, kv.TierHost)
			c.rematch(r)
			dec, err := NewEvolve(EvolveConfig{}).Route(t0, r, &c.v)
			if err != nil || dec.Prefill != "a" || len(dec.Fetches) != 0 || dec.ComputeTokens != 16*300 {
				t.Fatalf("self-managed to=%v from=%v: %+v %v", tc.to, tc.from, dec, err)
			}
		})
	}
}

func TestEvolveShortUncachedStaysOnDecodeNode(t *testing.T) {
	c := newCluster(t)
	c.node("p", roles.Prefill)
	c.node("d1", roles.Decode)
	c.node("d2", roles.Decode)
	r := c.request("r", 16*100+40, 9)
	c.holds("d2", r.Chain, 0, 100, kv.TierGPU) // the agent's previous turn decoded here
	c.rematch(r)
	dec, _ := NewEvolve(EvolveConfig{}).Route(t0, r, &c.v)
	if dec.Prefill != "d2" || dec.Decode != "d2" || dec.Disaggregated {
		t.Fatalf("decision %+v, want everything on d2", dec)
	}
}

func TestEvolveDecodeByLoadAndRoom(t *testing.T) {
	c := newCluster(t)
	c.node("p", roles.Prefill)
	c.node("d1", roles.Decode).Running = 200
	c.node("d2", roles.Decode).Running = 10
	c.node("d3", roles.Decode)
	c.get("d3").GPUBlocksUse = c.get("d3").GPUBlocks // no room
	r := c.request("r", 4000, 10)
	dec, _ := NewEvolve(EvolveConfig{}).Route(t0, r, &c.v)
	if dec.Decode != "d2" || dec.Prefill != "p" {
		t.Fatalf("decision %+v", dec)
	}
}

func TestEvolveBookkeeping(t *testing.T) {
	c := newCluster(t)
	c.node("p", roles.Prefill)
	c.node("d", roles.Decode)
	e := NewEvolve(EvolveConfig{})
	r := c.request("r", 4000, 11)
	e.Route(t0, r, &c.v)
	if e.queued["p"] <= 0 || e.decodes["d"] != 1 {
		t.Fatalf("after routing: queued %v decodes %v", e.queued, e.decodes)
	}
	e.FirstToken(t0, "r")
	if e.queued["p"] != 0 {
		t.Fatalf("after first token: %v", e.queued)
	}
	e.Finished(t0, "r")
	if len(e.decodes) != 0 || len(e.reqs) != 0 {
		t.Fatal("finished request left bookkeeping behind")
	}
}

func TestPoliciesSkipNodesNotServing(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			c := newCluster(t)
			c.node("p", roles.Prefill).Serving = false
			c.node("d1", roles.Decode).Serving = false
			c.node("d2", roles.Decode)
			p, err := New(name)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 4; i++ {
				dec, err := p.Route(t0, c.request(fmt.Sprint(i), 2000, 12), &c.v)
				if err != nil || dec.Prefill != "d2" || dec.Decode != "d2" {
					t.Fatalf("%+v %v", dec, err)
				}
			}
			c.get("d2").Serving = false
			if _, err := p.Route(t0, c.request("x", 2000, 12), &c.v); !errors.Is(err, ErrNoNode) {
				t.Fatalf("no serving node: %v", err)
			}
		})
	}
	if _, err := New("fastest"); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

func TestRoundRobinAlternates(t *testing.T) {
	c := newCluster(t)
	c.node("p1", roles.Prefill)
	c.node("p2", roles.Prefill)
	c.node("d1", roles.Decode)
	rr := &RoundRobin{}
	var got []string
	for i := 0; i < 4; i++ {
		dec, _ := rr.Route(t0, c.request(fmt.Sprint(i), 100, 13), &c.v)
		got = append(got, dec.Prefill+">"+dec.Decode)
	}
	if fmt.Sprint(got) != "[p1>d1 p2>d1 p1>d1 p2>d1]" {
		t.Fatalf("%v", got)
	}
}

// With every decode node full, the request queues on the roomiest one
// (the engine waits for sequences to finish) instead of failing.
func TestEvolveQueuesWhenNoDecodeNodeHasRoom(t *testing.T) {
	c := newCluster(t)
	c.node("p", roles.Prefill)
	c.node("d1", roles.Decode)
	c.node("d2", roles.Decode)
	c.get("d1").GPUBlocksUse = c.get("d1").GPUBlocks
	c.get("d2").GPUBlocksUse = c.get("d2").GPUBlocks - 3
	r := c.request("r", 4000, 12)
	dec, err := NewEvolve(EvolveConfig{}).Route(t0, r, &c.v)
	if err != nil || dec.Decode != "d2" {
		t.Fatalf("decision %+v, err %v: want d2, the roomiest", dec, err)
	}
}

// An agent's next turn decodes where its context is, unless that node is
// much busier: a few more sequences do not outweigh sending the whole
// context again, a share of the node's sequence limit does.
func TestEvolveDecodeStaysWithContextUnlessMuchBusier(t *testing.T) {
	for _, c := range []struct {
		name         string
		holderLoad   int
		heldBlocks   int
		wantDecodeOn string
	}{
		// MaxSeqs 256: holding the whole prompt counts as 8 sequences, and
		// these 100 of its 162 blocks as 4.9.
		{"slightly busier", 3, 100, "d2"},
		{"much busier", 20, 100, "d1"},
		{"holds a sliver", 3, 10, "d1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := newCluster(t)
			cl.node("p", roles.Prefill)
			cl.node("d1", roles.Decode)
			cl.node("d2", roles.Decode).Running = c.holderLoad
			r := cl.request("r", 16*100+1000, 12) // 100 full blocks and 1,000 new tokens
			cl.holds("d2", r.Chain, 0, c.heldBlocks, kv.TierGPU)
			cl.rematch(r)
			dec, err := NewEvolve(EvolveConfig{}).Route(t0, r, &cl.v)
			if err != nil {
				t.Fatal(err)
			}
			if dec.Decode != c.wantDecodeOn {
				t.Fatalf("decoded on %s, want %s (%+v)", dec.Decode, c.wantDecodeOn, dec)
			}
			// The reason an operator reads (evolve orchestrator --log-level
			// debug) names the decode node and the context it holds.
			held := 0
			if c.wantDecodeOn == "d2" {
				held = c.heldBlocks
			}
			if want := fmt.Sprintf("decode on %s, the least loaded (", dec.Decode); !strings.Contains(dec.Reason, want) ||
				!strings.Contains(dec.Reason, fmt.Sprintf("holding %d of the prompt's 162 blocks)", held)) {
				t.Fatalf("reason %q does not say why %s decodes", dec.Reason, dec.Decode)
			}
		})
	}
}

// PeerFetches plans the pulls that extend what a node holds without a
// gap, from the nodes it is told can serve them, while pulling beats
// recomputing; the front door uses it for a resumed answer as Route does
// for a new request.
func TestPeerFetchesExtendWhatTheNodeHolds(t *testing.T) {
	c := newCluster(t)
	c.node("to", roles.Decode)
	c.node("p", roles.Prefill)
	c.node("q", roles.Prefill)
	r := c.request("r", 16*100, 12)
	c.holds("to", r.Chain, 0, 10, kv.TierGPU)
	c.holds("p", r.Chain, 0, 60, kv.TierGPU)
	c.holds("q", r.Chain, 60, 80, kv.TierHost) // q holds 60..80 only: not a prefix, still a source
	c.rematch(r)
	all := map[kv.NodeID]string{}
	for _, n := range c.v.Nodes {
		all[n.Dir] = n.ID
	}
	fs := PeerFetches(c.get("to"), r.Match, bs, all)
	if len(fs) != 2 || fs[0].Src != "p" || fs[0].From != 10 || fs[0].End != 60 || fs[1].Src != "q" || fs[1].From != 60 || fs[1].End != 80 {
		t.Fatalf("fetches %+v, want 10..60 from p, then 60..80 from q", fs)
	}
	if fs[0].To != "to" || fs[0].EstSeconds != 50*60e-6 || fs[1].SrcTier != kv.TierHost {
		t.Fatalf("fetches %+v", fs)
	}

	// A source it is not told of ends the plan: nothing past the gap.
	without := map[kv.NodeID]string{c.get("q").Dir: "q"}
	if fs := PeerFetches(c.get("to"), r.Match, bs, without); len(fs) != 0 {
		t.Fatalf("fetched %+v with p not a source", fs)
	}
	// Recomputing a block cheaper than pulling it: nothing.
	c.get("to").NetSecPerBlock = float64(bs) * c.get("to").PrefillSecPerToken
	if fs := PeerFetches(c.get("to"), r.Match, bs, all); len(fs) != 0 {
		t.Fatalf("fetched %+v where recomputing is as cheap", fs)
	}
	c.get("to").NetSecPerBlock = 60e-6
	// A node whose engine keeps its own KV pulls nothing.
	c.get("to").SelfManagedKV = true
	if fs := PeerFetches(c.get("to"), r.Match, bs, all); len(fs) != 0 {
		t.Fatalf("fetched %+v to a self-managed node", fs)
	}
}

// The output an agent says it expects (Dynamo's osl hint) is what a
// decode node needs room for, not the max_tokens it allows: a node with
// room for the expected answer is not passed over for a busier one.
func TestEvolveRoomForTheExpectedOutput(t *testing.T) {
	c := newCluster(t)
	c.node("p", roles.Prefill)
	c.node("d1", roles.Decode).Running = 200
	c.node("d2", roles.Decode)
	r := c.request("r", 4000, 14)
	r.MaxTokens = 64000
	c.get("d2").GPUBlocksUse = c.get("d2").GPUBlocks - (4000+2000)/bs // room for 2,000 tokens of answer
	if dec, _ := NewEvolve(EvolveConfig{}).Route(t0, r, &c.v); dec.Decode != "d1" {
		t.Fatalf("without a hint: decode on %s, want d1 (d2 has no room for 64,000 tokens)", dec.Decode)
	}
	r.ID, r.ExpectedOutput = "r2", 1500
	if dec, _ := NewEvolve(EvolveConfig{}).Route(t0, r, &c.v); dec.Decode != "d2" {
		t.Fatalf("expecting 1,500 tokens: decode on %s, want d2", dec.Decode)
	}
}
