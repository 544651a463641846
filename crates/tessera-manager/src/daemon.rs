//! The manager as a network daemon: the [`Manager`] state machine behind a mutex, fed by a
//! transport and ticked by a timer. This is the only part of the crate that does I/O beyond
//! the embedded store.
//!
//! Started without `init` on a directory with no store, the daemon serves anyway but refuses
//! every request ([`refuse_without_store`]), and opens the store as soon as one appears there
//! (written by `tessera manager recover`); every tick it also checks that its store's file is
//! still there ([`Manager::check_store`]).

use crate::{refuse_without_store, Manager, ManagerConfig, ManagerOpenError};
use bytes::Bytes;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_transport::{serve_tcp_limited, BoxFuture, ConnectionId, FrameHandler, TcpLimits};
use tessera_wire::{encode_message, ManagerRequest};
use tokio::net::TcpListener;

/// How often liveness is re-evaluated when nothing else happens.
const TICK_INTERVAL: Duration = Duration::from_millis(100);

/// Errors starting the manager daemon.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The metadata store could not be opened.
    #[error(transparent)]
    Open(#[from] ManagerOpenError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {detail}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        detail: String,
    },
}

/// The manager, or where its store should appear.
enum Served {
    /// The store is open.
    Running(Box<Manager>),
    /// No store at this path yet: every request is refused.
    NoStore(PathBuf),
}

impl Served {
    fn handle(&mut self, request: ManagerRequest, now: Instant) -> tessera_wire::ManagerResponse {
        match self {
            Served::Running(manager) => manager.handle(request, now),
            Served::NoStore(path) => refuse_without_store(path, &request),
        }
    }

    /// Ticks the manager and checks its store's file; without a store, opens one that has
    /// appeared.
    fn tick(&mut self, dir: &Path, config: ManagerConfig, now: Instant) {
        match self {
            Served::Running(manager) => {
                manager.tick(now);
                let _ = manager.check_store();
            }
            Served::NoStore(path) if path.exists() => match Manager::open_existing(dir, config) {
                Ok(manager) => {
                    tracing::warn!(
                        "metadata store {} appeared (recovered); serving cluster {:#x}",
                        path.display(),
                        manager.cluster()
                    );
                    *self = Served::Running(Box::new(manager));
                }
                Err(e) => tracing::error!("cannot open the store that appeared: {e}"),
            },
            Served::NoStore(_) => {}
        }
    }
}

/// A running manager daemon.
pub struct RunningManager {
    /// The address it listens on.
    pub addr: SocketAddr,
    manager: Arc<Mutex<Served>>,
    serve: tokio::task::JoinHandle<()>,
    ticker: tokio::task::JoinHandle<()>,
}

impl RunningManager {
    /// Run until the serving task ends.
    pub async fn wait(self) {
        let _ = self.serve.await;
        self.ticker.abort();
    }

    /// Stop serving (the store is closed when the last request finishes).
    pub fn stop(self) {
        self.serve.abort();
        self.ticker.abort();
    }

    /// Stop serving and make every metadata change durable.
    pub async fn shutdown(self) -> Result<(), tessera_wire::ManagerError> {
        self.serve.abort();
        self.ticker.abort();
        let manager = self.manager;
        tokio::task::spawn_blocking(move || match &mut *manager.lock().unwrap() {
            Served::Running(manager) => manager.flush(),
            Served::NoStore(_) => Ok(()),
        })
        .await
        .unwrap_or_else(|e| Err(tessera_wire::ManagerError::Store(e.to_string())))
    }
}

struct ManagerHandler {
    manager: Arc<Mutex<Served>>,
}

impl FrameHandler for ManagerHandler {
    fn handle(
        &self,
        _connection: ConnectionId,
        message: Bytes,
        _payload: Bytes,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        let request: ManagerRequest = match tessera_wire::decode_message(&message) {
            Ok(request) => request,
            Err(e) => {
                tracing::info!("undecodable manager request: {e}");
                return Box::pin(async { None });
            }
        };
        let manager = self.manager.clone();
        Box::pin(async move {
            // Mutations commit to the store (an fsync): keep them off the async workers.
            let response = tokio::task::spawn_blocking(move || {
                manager.lock().unwrap().handle(request, Instant::now())
            })
            .await
            .ok()?;
            Some((Bytes::from(encode_message(&response)), Bytes::new()))
        })
    }
}

/// Open the metadata store in `dir` and serve it on `listen`. With `init`, a missing store is
/// created (a new cluster); without, the daemon waits for one, refusing every request (see
/// the module doc). TCP peers are bounded by the default
/// [`TcpLimits`].
pub async fn start(
    listen: SocketAddr,
    dir: &Path,
    config: ManagerConfig,
    init: bool,
) -> Result<RunningManager, DaemonError> {
    start_limited(listen, dir, config, init, TcpLimits::default()).await
}

/// Open the metadata store in `dir` and serve it on `listen`; what TCP peers may hold
/// (connections, idle time, memory for requests in flight) is bounded by `limits`; `init` as
/// for [`start`].
pub async fn start_limited(
    listen: SocketAddr,
    dir: &Path,
    config: ManagerConfig,
    init: bool,
    limits: TcpLimits,
) -> Result<RunningManager, DaemonError> {
    let opening = dir.to_path_buf();
    let opened = tokio::task::spawn_blocking(move || {
        if init {
            Manager::open(&opening, config)
        } else {
            Manager::open_existing(&opening, config)
        }
    })
    .await
    .expect("open does not panic");
    let served = match opened {
        Ok(manager) => Served::Running(Box::new(manager)),
        Err(ManagerOpenError::NoStore { path }) => {
            tracing::error!(
                "no metadata store at {}: refusing every request until one is there. If servers \
                 hold this cluster's data, rebuild it with `tessera manager recover --dir {} \
                 --servers ADDR,...`; for a new, empty cluster, start with --init",
                path.display(),
                dir.display()
            );
            for rescued in rescued_copies(dir) {
                tracing::error!(
                    "{} is a whole copy a manager made when it found its store deleted or \
                     replaced; if it is this cluster's latest, move it to {} instead of \
                     recovering (it keeps what servers owe, which recovery cannot know)",
                    rescued.display(),
                    path.display()
                );
            }
            Served::NoStore(path)
        }
        Err(e) => return Err(e.into()),
    };
    let manager = Arc::new(Mutex::new(served));
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| DaemonError::Listen {
            addr: listen,
            detail: e.to_string(),
        })?;
    let addr = listener.local_addr().map_err(|e| DaemonError::Listen {
        addr: listen,
        detail: e.to_string(),
    })?;
    let ticking = manager.clone();
    let dir = dir.to_path_buf();
    let ticker = tokio::spawn(async move {
        loop {
            tokio::time::sleep(TICK_INTERVAL).await;
            let ticking = ticking.clone();
            let dir = dir.clone();
            // A stat of the store's file, or opening it: off the async workers.
            let _ = tokio::task::spawn_blocking(move || {
                ticking.lock().unwrap().tick(&dir, config, Instant::now())
            })
            .await;
        }
    });
    let serve = tokio::spawn(serve_tcp_limited(
        listener,
        Arc::new(ManagerHandler {
            manager: manager.clone(),
        }),
        limits,
    ));
    Ok(RunningManager {
        addr,
        manager,
        serve,
        ticker,
    })
}

/// The copies a manager made of its store when it found the store's file lost.
fn rescued_copies(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("manager.redb.rescued-"))
        })
        .collect();
    found.sort();
    found
}
