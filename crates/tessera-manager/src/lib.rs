//! Tessera's metadata manager, as a state machine over an embedded store.
//!
//! This crate owns the cluster's metadata: the namespace (path to file id), each file's layout,
//! size and the servers of its columns, the storage servers (id, address, store incarnation),
//! and the stripes each server *owes*: stripes it missed while writes went on without it, which
//! count as lost until it is resynced. It also judges liveness from heartbeats. A [`Manager`]
//! takes a [`ManagerRequest`](tessera_wire::ManagerRequest) and returns a
//! [`ManagerResponse`](tessera_wire::ManagerResponse); the network daemon around it moves the
//! frames.
//!
//! It must never open a socket, start a thread or read the clock: time comes in as an argument
//! (`now`) to [`Manager::handle`] and [`Manager::tick`], so the same code runs under the daemon
//! and in a simulator. Its one piece of I/O is its store, a redb database at `dir/manager.redb`:
//! every request that changes metadata commits one write transaction before it is answered, and
//! that commit is the durability point. Liveness is kept in memory only, so after a restart every
//! server is down until it registers or heartbeats again.
//!
//! A server's state is [`Down`](tessera_wire::ServerState::Down) when it is not live (no
//! heartbeat within [`ManagerConfig::heartbeat_timeout`], or reported unreachable),
//! [`Stale`](tessera_wire::ServerState::Stale) when live but owing stripes of some file, and
//! [`Up`](tessera_wire::ServerState::Up) otherwise. A server that comes back with a new
//! incarnation has lost its store and owes every stripe of every file it holds a column of.
//!
//! Replacing a file is atomic: a writer creates a *pending* file (a fresh id that no path names
//! yet), writes and syncs it, and commits it, which in one transaction points the path at it
//! and removes the file that had it. A pending file whose writer goes silent for
//! [`ManagerConfig::pending_lease`] (no renewal, lookup or size change) is removed by
//! [`Manager::tick`]. Every removed file becomes an *orphan* of each of its servers until that
//! server says it deleted its data (`Orphans`, `OrphansRemoved`): servers ask, because the
//! manager never calls them, and a server that was down when the file went learns of it when it
//! is back.
//!
//! The cluster has a random id, drawn when the store is created. A server remembers the id of
//! the cluster it joined and names it when it registers and heartbeats; a manager of another
//! cluster (one that took over its manager's address) refuses it with
//! [`WrongCluster`](tessera_wire::ManagerError::WrongCluster).
//!
//! # Losing the store, and getting it back
//!
//! The store is the cluster: without it the servers' bytes have no names. The rules:
//! - **A store is created only when asked.** [`Manager::open`] creates a missing store (a new
//!   cluster): `tessera manager --init`, and `tessera up` on its first start.
//!   [`Manager::open_existing`] never does; the daemon started without `--init` on a directory
//!   with no store serves anyway, refusing every request with
//!   [`NoStore`](tessera_wire::ManagerError::NoStore) (naming the cluster a server's store
//!   joined and `tessera manager recover`), so that a server holding a cluster's data is never
//!   let into a new, empty one, and opens the store as soon as one appears.
//! - **A store lost while running is noticed.** The store's file is identified by device and
//!   inode when opened; [`Manager::check_store`] (every daemon tick, 100 ms, and before every
//!   commit) finds it deleted or replaced. From then on every change is refused with
//!   [`StoreLost`](tessera_wire::ManagerError::StoreLost), since it would be committed into a
//!   file that is gone at the next start; reads and heartbeats go on from the open database.
//!   The open database, still whole, is copied to `manager.redb.rescued-<inode>` beside it,
//!   and the error log says to stop the manager and move that copy into place.
//! - **The servers hold enough to rebuild it.** Each server keeps a checksummed record of every
//!   file it holds a column of (`tessera_store::FileRecord`); [`recovery`] merges them into a
//!   new store with the old cluster id, servers and incarnations (`tessera manager recover`).
//!   What recovery cannot know is listed in the [`recovery`] module's doc: above all the stripes
//!   servers owed, so a rescued copy is better when there is one.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use tessera_layout::Scheme;
//! use tessera_manager::{Manager, ManagerConfig};
//! use tessera_wire::{LayoutRequest, ManagerRequest, ManagerResponse, ServerState};
//!
//! let dir = tempfile::tempdir().unwrap();
//! // A new cluster: the store is created (`--init`).
//! let mut manager = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
//! let start = Instant::now();
//!
//! // Three storage servers register and are given ids 1, 2 and 3.
//! for port in 7001..7004 {
//!     let addr = format!("127.0.0.1:{port}");
//!     let request = ManagerRequest::Register { server: None, addr, incarnation: 42, cluster: None };
//!     let answer = manager.handle(request, start);
//!     assert!(matches!(answer, ManagerResponse::Registered { state: ServerState::Up, .. }));
//! }
//!
//! // A RAID-5 file over all three.
//! let layout = LayoutRequest { scheme: Scheme::Raid5, stripe_unit: 65536, width: None };
//! let request = ManagerRequest::Create { path: "/a".into(), layout, replace: false };
//! let ManagerResponse::File(view) = manager.handle(request, start) else { panic!() };
//! assert_eq!(view.meta.layout.width, 3);
//!
//! // Server 3 falls silent; the others keep heartbeating.
//! let later = start + Duration::from_secs(3);
//! let cluster = manager.cluster();
//! for server in [1, 2] {
//!     manager.handle(ManagerRequest::Heartbeat { server, incarnation: 42, cluster }, later);
//! }
//! manager.tick(later);
//! assert_eq!(manager.server_state(3), Some(ServerState::Down));
//! ```

mod auth;
pub mod command;
pub mod daemon;
pub mod group;
mod keys;
mod manager;
pub mod metrics;
mod ranges;
pub mod recovery;
pub mod replica;
pub mod replica_core;
pub mod reservations;
mod snapshot;
mod store;

pub use auth::{authorize, roles_allowed};
pub use keys::{ACCESS_KEYS_MAX, KEY_NAME_BYTES_MAX};
pub use manager::{
    refuse_without_store, Manager, ManagerConfig, ManagerOpenError, HEARTBEAT_TIMEOUT_DEFAULT,
    ONCE_EXPIRY_DEFAULT, PATH_BYTES_MAX, PENDING_LEASE_DEFAULT,
};
pub use snapshot::SNAPSHOT_READY_LEASE_DEFAULT;

#[cfg(test)]
mod namespace_tests;
#[cfg(test)]
mod replica_tests;
#[cfg(test)]
mod replication_tests;
#[cfg(test)]
mod store_loss_tests;
#[cfg(test)]
mod tests;
