package orchestrator

import (
	"context"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sys/unix"
)

// A full data directory: the embedded NATS server, failing to write its
// JetStream files, shuts JetStream down (nats-server expects an operator
// to free space and restart it). Pins and role overrides can then not be
// stored (a role change is refused, with why: NotStoredError), and the
// planner's lease can not be renewed: the leader steps down. Before, no
// leader returned when the disk was freed, since JetStream stayed off
// until the orchestrator restarted. The watch turns JetStream on again by
// itself once the directory has room, and the lease, the pins and the
// roles work again.

// jetStreamRoom is the free space the data directory needs before
// JetStream is turned on again, enough that it does not fill at once:
// 64 MiB, or a tenth of a smaller file system.
const jetStreamRoom = 64 << 20

// jetStreamCheck is how often the watch looks.
const jetStreamCheck = 2 * time.Second

// watchJetStream turns the embedded server's JetStream on again once the
// data directory has room, until ctx ends. nats-server either turns
// JetStream off when it runs out of space, or keeps a stream's write error
// for good (its writes then go unanswered after the disk was freed): when
// writes of the orchestrator's have failed lately, the watch probes its
// buckets, and restarts JetStream (which reloads the streams from disk)
// once the directory has room. A server in a NATS cluster is left alone:
// its peers hold the replicas.
func (o *Orchestrator) watchJetStream(ctx context.Context, ns *server.Server) {
	if ns == nil || o.cfg.DataDir == "" {
		return
	}
	t := time.NewTicker(jetStreamCheck)
	defer t.Stop()
	told := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		enabled := ns.JetStreamEnabled()
		if enabled && (time.Since(time.Unix(0, o.storeFailed.Load())) > 30*time.Second || o.storeWrites(ctx)) {
			told = false
			continue
		}
		free, room, err := freeBytes(o.cfg.DataDir)
		if !told {
			told = true
			o.log.Error("the event plane's store (JetStream) takes no writes: its data directory is full or failing; role overrides and pins cannot be stored, and no orchestrator can lead the planner, until it has room",
				"data_dir", o.cfg.DataDir, "free_bytes", free, "err", err)
		}
		if err != nil || free < room || len(o.cfg.ClusterPeers) > 0 {
			continue
		}
		if enabled {
			if err := ns.ShutdownJetStream(); err != nil {
				o.log.Warn("the event plane's store did not stop for its restart", "err", err)
				continue
			}
		}
		if err := ns.EnableJetStream(&server.JetStreamConfig{StoreDir: o.cfg.DataDir}); err != nil {
			o.log.Warn("the event plane's store did not start again", "err", err)
			continue
		}
		if o.storeWrites(ctx) {
			told = false
			o.storeFailed.Store(0)
			o.log.Info("the event plane's store (JetStream) takes writes again: its data directory has room", "free_bytes", free)
		}
	}
}

// storeWrites reports whether the role and lease buckets take a write
// now (a probe key; the lease's expires with the bucket's TTL).
func (o *Orchestrator) storeWrites(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if o.store != nil {
		if _, err := o.store.kv.Put(ctx, storeProbeKey, []byte("{}")); err != nil {
			return false
		}
	}
	if o.lease != nil {
		if _, err := o.lease.kv.Put(ctx, storeProbeKey, []byte("{}")); err != nil {
			return false
		}
	}
	return true
}

// storeProbeKey is the key storeWrites writes: no node id has its dot.
const storeProbeKey = "probe.evolve"

// noteStoreFailure records that a write to the store failed now.
func (o *Orchestrator) noteStoreFailure() { o.storeFailed.Store(time.Now().UnixNano()) }

// freeBytes is the space free to this process in dir's file system, and
// the room JetStream needs there (jetStreamRoom).
func freeBytes(dir string) (free, room uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	bs := uint64(st.Bsize)
	return st.Bavail * bs, min(jetStreamRoom, st.Blocks*bs/10), nil
}
