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
//! ```
//! use std::time::{Duration, Instant};
//! use tessera_layout::Scheme;
//! use tessera_manager::{Manager, ManagerConfig};
//! use tessera_wire::{LayoutRequest, ManagerRequest, ManagerResponse, ServerState};
//!
//! let dir = tempfile::tempdir().unwrap();
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
pub mod daemon;
mod keys;
mod manager;
mod ranges;
mod store;

pub use auth::{authorize, roles_allowed};
pub use keys::{ACCESS_KEYS_MAX, KEY_NAME_BYTES_MAX};
pub use manager::{
    Manager, ManagerConfig, ManagerOpenError, HEARTBEAT_TIMEOUT_DEFAULT, PATH_BYTES_MAX,
    PENDING_LEASE_DEFAULT,
};

#[cfg(test)]
mod tests;
