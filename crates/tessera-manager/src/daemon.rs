//! The manager as a network daemon: the [`Manager`] state machine behind a mutex, fed by a
//! transport and ticked by a timer. This is the only part of the crate that does I/O beyond
//! the embedded store.

use crate::{Manager, ManagerConfig, ManagerOpenError};
use bytes::Bytes;
use std::net::SocketAddr;
use std::path::Path;
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

/// A running manager daemon.
pub struct RunningManager {
    /// The address it listens on.
    pub addr: SocketAddr,
    manager: Arc<Mutex<Manager>>,
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
        tokio::task::spawn_blocking(move || manager.lock().unwrap().flush())
            .await
            .unwrap_or_else(|e| Err(tessera_wire::ManagerError::Store(e.to_string())))
    }
}

struct ManagerHandler {
    manager: Arc<Mutex<Manager>>,
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

/// Open the metadata store in `dir` and serve it on `listen`, within the default
/// [`TcpLimits`].
pub async fn start(
    listen: SocketAddr,
    dir: &Path,
    config: ManagerConfig,
) -> Result<RunningManager, DaemonError> {
    start_limited(listen, dir, config, TcpLimits::default()).await
}

/// Open the metadata store in `dir` and serve it on `listen`; what TCP peers may hold
/// (connections, idle time, memory for requests in flight) is bounded by `limits`.
pub async fn start_limited(
    listen: SocketAddr,
    dir: &Path,
    config: ManagerConfig,
    limits: TcpLimits,
) -> Result<RunningManager, DaemonError> {
    let dir = dir.to_path_buf();
    let manager = tokio::task::spawn_blocking(move || Manager::open(&dir, config))
        .await
        .expect("open does not panic")?;
    let manager = Arc::new(Mutex::new(manager));
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
    let ticker = tokio::spawn(async move {
        loop {
            tokio::time::sleep(TICK_INTERVAL).await;
            ticking.lock().unwrap().tick(Instant::now());
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
