//! Whole-cluster deterministic simulation of Tessera (issue 15, item 7).
//!
//! This crate owns a cluster in one process, seeded by one `u64`, and an explorer that runs
//! random workloads on it with crashes at random steps and checks every answer against a model.
//! It runs the real code: the manager's state machine ([`tessera_manager::Manager`], with the
//! simulator's virtual clock as `now` and a cluster id derived from the seed), the storage
//! server's request handling ([`tessera_server::handler`]) over real [`tessera_store::Store`]s
//! in temporary directories, and the real [`tessera_client::Client`], all talking over
//! [`tessera_transport::MemNetwork`] (seeded drops, delays, partitions, crashed daemons) on a
//! tokio current-thread runtime started paused, so every timeout is virtual and a run of
//! dozens of operations with 1 s timeouts takes milliseconds.
//!
//! # What the explorer does ([`explore`])
//! Per seed: files of the chosen schemes (stripe units of 4 and 8 KiB over 4 servers), writes
//! at random offsets and lengths (partial stripes, whole ones, both), reads checked as they
//! go, syncs; at random operations the client is *killed* (its operation's future dropped at
//! its k-th request, its connections closed, a new client started: the write is not
//! acknowledged, so each of its bytes may read old or new) and a server is killed at the k-th
//! request of an operation (restarted at once from its directory, or kept down for some
//! operations so that reads and writes run degraded and it returns stale, or brought back on
//! a blank disk). Then recovery (network healed, every server started, every stale one
//! rebuilt), every file read whole, and read again with each server lost in turn. A byte no
//! unacknowledged write touched must read exactly as acknowledged; one that such a write
//! touched may read any value it or the acknowledged writes gave it. A failure prints the
//! seed and the trace of the run; [`replay`] runs one seed again.
//!
//! # Determinism, and what is not simulated yet
//! The workload and the network draw from generators seeded by the seed, and the servers'
//! disk calls run in place on the runtime's one thread ([`tessera_server::run_disk_inline`])
//! instead of on tokio's blocking pool, so nothing depends on which thread finishes first
//! (with the pool, a test of the same seed twice differed in a few requests); the network
//! also hands one request at a time to the daemons, in arrival order. Store incarnations are still
//! drawn by `rand::random` in `Store::open`; they only ever compare equal or not, so the run
//! does not depend on them. Servers keep the page cache when they are killed (a process
//! crash): writes not yet synced are not lost, and bytes reach the disk whole.
//!
//! # The next increment: an in-memory disk
//! Power loss, torn writes and lost fsyncs need a seam under the store. `tessera-store` does
//! all its file I/O in a few places (`io.rs` positioned reads and writes, `region.rs` and
//! `overflow.rs` opening, extending and syncing files, `meta.rs` writing and renaming
//! `store.toml`, the directory syncs). The plan: a `Disk` trait in `tessera-store`
//! (`open(path) -> Box<dyn DiskFile>`, `rename`, `remove`, `sync_dir`, `list`; `DiskFile`:
//! `read_at`, `write_at`, `set_len`, `sync_data`, `len`), the real implementation a thin
//! wrapper over `std::fs` chosen by `Store::open`, and `Store::open_on(disk, root)` for the
//! simulator. The simulator's `MemDisk` keeps per file the durable bytes and the writes since
//! the last sync; a simulated power loss keeps a seeded subset of the unsynced writes, each
//! torn at a random 512-byte boundary, and flips seeded bits on request; renames become durable
//! only with `sync_dir`. The checker then holds only *synced* acknowledged bytes to the exact
//! standard after a power loss. With the disk in memory, the serialization of deliveries can
//! go (disk calls no longer need the blocking pool), which lets the network reorder requests
//! between servers as well.
//!
//! Also left: a manager crash and restart inside a run (its redb store reopened), several
//! clients at once (parity locks contended, a dead client's lock), the datagram transport's
//! state machine under the network instead of whole frames, and scrub inside the workload.

pub mod cluster;
pub mod explore;
pub mod model;

pub use cluster::SimCluster;
pub use explore::{replay, ExploreConfig, Failure, RunReport};
pub use model::{FileModel, Mismatch};
