//! Whole-cluster deterministic simulation of Tessera (issue 15, item 7).
//!
//! This crate owns a cluster in one process, seeded by one `u64`, and an explorer that runs
//! random workloads on it with crashes at random steps and checks every answer against a model.
//! It runs the real code: the manager's state machine ([`tessera_manager::Manager`], with the
//! simulator's virtual clock as `now` and a cluster id derived from the seed), the storage
//! server's request handling ([`tessera_server::handler`]) over real [`tessera_store::Store`]s
//! (with the daemon's background torn-stripe resolver, `Client::resolve_torn` every 2 s),
//! each on its own in-memory disk ([`tessera_store::MemDisk`]: power losses, torn writes and
//! flipped bits by seed), and the real [`tessera_client::Client`], all talking over
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
//! request of an operation (restarted at once from its disk, or kept down for some operations
//! so that reads and writes run degraded and it returns stale, or brought back on a blank
//! disk), or loses power (its disk keeps, drops or tears each write not synced), and bits flip
//! in any server's files. After a flip the next fault waits for a restart of that server and a
//! scrub, as an operator scrubs when a disk reports errors (one failure at a time). Then
//! recovery (network healed, every server restarted, every stale one rebuilt), every file
//! read whole, a scrub if bits flipped, and every file read again with each server lost in
//! turn. A byte no unacknowledged write touched must read exactly as acknowledged; one that
//! such a write touched may read any value it or the acknowledged writes gave it. A failure
//! prints the seed and the trace of the run; [`replay`] runs one seed again.
//!
//! # Determinism, and what is not simulated yet
//! The workload and the network draw from generators seeded by the seed, and the servers'
//! disk calls run in place on the runtime's one thread ([`tessera_server::run_disk_inline`]),
//! so nothing depends on which thread finishes first; the network also hands one request at
//! a time to the daemons, in arrival order. Store incarnations are still drawn by
//! `rand::random` in `Store::open_on`; they only ever compare equal or not, so the run does
//! not depend on them. A killed server keeps its page cache (a process crash); a power loss
//! is its disk's ([`SimCluster::power_loss`]).
//!
//! A store that lost answered writes to a power loss opens empty as a new incarnation and is
//! rebuilt (`tessera-store`'s `boot.rs`), so every acknowledged byte must read exactly, synced
//! or not; RAID-0 files on it may no longer be read. A flipped record of `overflow.log`
//! makes every overflow range of that file read corrupt on that server (never wrong) until
//! rewritten, up to the maximum size: a scrub repairs the stripes the file has and up to 1,024
//! past its size that some server holds bytes or damage in (bit-flip seed 196 grew a file over
//! such damage on two servers when scrub stopped at the size). Farther out it stays.
//!
//! # The replicated manager ([`replicas`], [`metadata`])
//! [`SimCluster::start_replicated`] replaces the one manager by 3 or 5 replicas: each the
//! total order's sans-IO node (`tessera_order::Node`) and the manager replica's sans-IO core
//! (`tessera_manager::replica_core`, shared with the `tessera manager --id` daemon) over its
//! own redb store, their datagrams on an in-memory queue with seeded delay, loss and
//! partitions; replicas are killed and restarted (catching up from a peer's store) and cut
//! off. [`metadata::check_metadata`] runs clients' metadata operations under such faults and
//! checks the history against a sequential model of the namespace (see its doc).
//!
//! Also left: a manager crash and restart inside the explorer's runs (its redb store
//! reopened), several clients at once (parity locks contended, a dead client's lock), the
//! datagram transport's state machine under the network instead of whole frames, and scrub
//! inside the workload.

pub mod before_call;
pub mod cluster;
pub mod explore;
pub mod metadata;
pub mod model;
pub mod replicas;

pub use before_call::BeforeCall;
pub use cluster::SimCluster;

/// Runs `test` on a fresh current-thread runtime whose clock starts paused (virtual time),
/// with the servers' disk calls made in place, so that nothing happens on another thread.
pub fn run_virtual<F: std::future::Future>(test: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    tessera_server::run_disk_inline(true);
    runtime.block_on(test)
}
pub use explore::{replay, ExploreConfig, Failure, RunReport};
pub use model::{FileModel, Mismatch};

/// Prints the cluster's log when `RUST_LOG` asks for it (e.g. `tessera_client=debug`), for
/// a test replaying a seed.
pub fn log_if_asked() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}
