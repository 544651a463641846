//! Copy-on-write snapshots from the client's side: taking one (manager, then every server of
//! its files, then readying it at the manager), reading a file as a snapshot holds it, and
//! removing one. The design is in `tessera-store`'s `snapshot` module.
//!
//! A snapshot becomes readable only once every server holding its files has begun it
//! durably: a write acknowledged before `snapshot_create` started is in it, a write begun
//! after it returned is not, and a write running meanwhile is in it whole or not at all on
//! every stripe of a parity scheme (each server is fenced before any begins; the argument
//! is in `tessera-store`'s `snapshot` module), so a degraded read of the snapshot returns
//! what a read with every column up does. A server that cannot be told, or a fence that does
//! not drain, makes the creation fail, and the half-made snapshot is removed: a server that
//! never began it would overwrite its blocks without copying them.

use crate::context::call_store;
use crate::{Client, ClientError};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use tessera_wire::{
    FileId, FileView, ManagerError, ManagerRequest, ManagerResponse, ServerId, ServerStatus,
    SnapshotFile, SnapshotInfo, StorageRequest, StorageResponse,
};

/// Most files one `SnapshotBegin` names (the server's own bound).
const BEGIN_FILES_PER_REQUEST: usize = 4096;

/// The begins must all be answered within this of raising the first fence: a fence stands
/// for [`tessera_wire::SNAPSHOT_FENCE_LEASE_MS`] from when the server raised it, and the
/// margin covers clocks that run a little apart.
const SNAPSHOT_BEGIN_WITHIN: std::time::Duration =
    std::time::Duration::from_millis(tessera_wire::SNAPSHOT_FENCE_LEASE_MS * 4 / 5);

/// A file as a snapshot holds it, ready to be read.
#[derive(Debug, Clone)]
pub struct SnapshotHandle {
    /// The snapshot's epoch.
    pub epoch: u64,
    /// The file as it stood.
    pub file: SnapshotFile,
}

impl SnapshotHandle {
    /// The file's size when the snapshot was taken.
    pub fn size(&self) -> u64 {
        self.file.meta.size
    }
}

/// What a removal freed.
#[derive(Debug, Clone)]
pub struct SnapshotRemoval {
    /// The snapshot removed.
    pub snapshot: SnapshotInfo,
    /// Files removed from the namespace before, whose data went with it.
    pub freed_files: usize,
    /// Servers that could not be told to drop their copies (they keep them until the file
    /// is removed).
    pub unreachable: Vec<ServerId>,
}

impl Client {
    /// Takes snapshot `name` of every file whose path starts with `prefix`. No data is
    /// copied; see the module doc for which writes it holds.
    pub async fn snapshot_create(
        &self,
        name: &str,
        prefix: &str,
    ) -> Result<SnapshotInfo, ClientError> {
        let request = ManagerRequest::SnapshotCreate {
            name: name.to_string(),
            prefix: prefix.to_string(),
        };
        let info = match self.manager_call(request).await? {
            ManagerResponse::Snapshots(mut one) if one.len() == 1 => one.remove(0),
            other => return Err(self.unexpected("a snapshot", other)),
        };
        if let Err(error) = self.begin_everywhere(&info).await {
            let request = ManagerRequest::SnapshotRemove {
                name: name.to_string(),
            };
            let _ = self.manager_call(request).await;
            return Err(error);
        }
        let ready = ManagerRequest::SnapshotReady {
            name: name.to_string(),
        };
        match self.manager_call(ready).await? {
            ManagerResponse::Done => Ok(SnapshotInfo {
                ready: true,
                ..info
            }),
            other => Err(self.unexpected("done", other)),
        }
    }

    /// Begins the snapshot at every server of its files, behind a fence (see the module
    /// doc): fence everywhere, begin everywhere, then release the fences (also when a step
    /// failed; a fence not released lapses by itself).
    async fn begin_everywhere(&self, info: &SnapshotInfo) -> Result<(), ClientError> {
        let servers = self.status().await?;
        let mut per_server: BTreeMap<ServerId, Vec<FileId>> = BTreeMap::new();
        for file in &info.files {
            for &server in &file.meta.servers {
                per_server.entry(server).or_default().push(file.meta.id);
            }
        }
        let fenced_at = tokio::time::Instant::now();
        let fence = |epoch, files| StorageRequest::SnapshotFence { epoch, files };
        let mut done = self
            .tell_all(&servers, &per_server, info.epoch, fence)
            .await;
        if done.is_ok() {
            let begin = |epoch, files| StorageRequest::SnapshotBegin { epoch, files };
            done = self
                .tell_all(&servers, &per_server, info.epoch, begin)
                .await;
        }
        // Every begin must have run while every fence stood: the fences were raised after
        // `fenced_at`, and each stands for its lease from then, on a clock that runs as ours.
        if done.is_ok() && fenced_at.elapsed() >= SNAPSHOT_BEGIN_WITHIN {
            done = Err(ClientError::SnapshotTooSlow {
                name: info.name.clone(),
                within_ms: SNAPSHOT_BEGIN_WITHIN.as_millis() as u64,
            });
        }
        let release = |epoch, files| StorageRequest::SnapshotRelease { epoch, files };
        let _ = self
            .tell_all(&servers, &per_server, info.epoch, release)
            .await;
        done
    }

    /// Sends `request(epoch, files)` to every server for its files, all servers at once;
    /// fails with the first server that refuses or cannot be reached.
    async fn tell_all(
        &self,
        servers: &[ServerStatus],
        per_server: &BTreeMap<ServerId, Vec<FileId>>,
        epoch: u64,
        request: impl Fn(u64, Vec<FileId>) -> StorageRequest,
    ) -> Result<(), ClientError> {
        let request = &request;
        let calls = per_server.iter().map(|(&server, files)| {
            let status = servers.iter().find(|s| s.id == server).cloned();
            async move {
                let status = status.ok_or(ClientError::NoSuchServer(server))?;
                let addr = server_addr(&status)?;
                for chunk in files.chunks(BEGIN_FILES_PER_REQUEST) {
                    let call = request(epoch, chunk.to_vec());
                    let answer =
                        call_store(self, addr, status.incarnation, call, Bytes::new()).await;
                    match answer {
                        Ok((StorageResponse::Done, _)) => {}
                        Ok((StorageResponse::Error(error), _)) => {
                            return Err(ClientError::Storage {
                                server,
                                addr,
                                error,
                            })
                        }
                        Ok((other, _)) => {
                            return Err(ClientError::Protocol {
                                peer: format!("server {server} ({addr})"),
                                detail: format!("expected done, got {other:?}"),
                            })
                        }
                        Err(_) => return Err(ClientError::ServerDown(server)),
                    }
                }
                Ok(())
            }
        });
        futures::future::try_join_all(calls).await.map(|_| ())
    }

    /// The snapshots, without their files.
    pub async fn snapshot_list(&self) -> Result<Vec<SnapshotInfo>, ClientError> {
        match self
            .manager_call(ManagerRequest::SnapshotList { name: None })
            .await?
        {
            ManagerResponse::Snapshots(all) => Ok(all),
            other => Err(self.unexpected("snapshots", other)),
        }
    }

    /// Snapshot `name` with its files.
    pub async fn snapshot_info(&self, name: &str) -> Result<SnapshotInfo, ClientError> {
        let request = ManagerRequest::SnapshotList {
            name: Some(name.to_string()),
        };
        match self.manager_call(request).await? {
            ManagerResponse::Snapshots(mut one) if one.len() == 1 => Ok(one.remove(0)),
            other => Err(self.unexpected("a snapshot", other)),
        }
    }

    /// The file at `path` as snapshot `name` holds it.
    pub async fn snapshot_open(
        &self,
        name: &str,
        path: &str,
    ) -> Result<SnapshotHandle, ClientError> {
        let info = self.snapshot_info(name).await?;
        if !info.ready {
            return Err(ManagerError::NotFound(format!(
                "snapshot {name} (it was not completed: remove it and take it again)"
            ))
            .into());
        }
        let file = info
            .files
            .into_iter()
            .find(|file| file.meta.path == path)
            .ok_or_else(|| ManagerError::NotFound(format!("{path} in snapshot {name}")))?;
        Ok(SnapshotHandle {
            epoch: info.epoch,
            file,
        })
    }

    /// Up to `len` bytes at `offset` of a file as its snapshot holds it (fewer at its end
    /// then). A lost column is reconstructed from the snapshot's view of the others (not for
    /// Hybrid files).
    pub async fn snapshot_read_at(
        &self,
        handle: &SnapshotHandle,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, ClientError> {
        let ctx = self.snapshot_context(handle).await?;
        ctx.check_range(offset, len)?;
        let available = ctx.meta.size.saturating_sub(offset).min(len);
        let mut out = vec![0u8; available as usize];
        let read = ctx.read_into(self, offset, &mut out).await?;
        out.truncate(read);
        Ok(out)
    }

    /// Read `len` bytes at `offset` of a file as its snapshot holds it (fewer past its end)
    /// into `sink`, as [`Client::download`] does: the servers are looked up once, several
    /// chunks in flight. Returns the bytes read.
    pub async fn snapshot_download(
        &self,
        handle: &SnapshotHandle,
        offset: u64,
        len: u64,
        sink: &mut dyn std::io::Write,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64, ClientError> {
        let ctx = self.snapshot_context(handle).await?;
        self.download_from(&ctx, offset, len, sink, None, progress)
            .await
    }

    /// The view a snapshot's reads take of its file: the servers as they are now.
    async fn snapshot_context(
        &self,
        handle: &SnapshotHandle,
    ) -> Result<crate::context::FileContext, ClientError> {
        let servers = self.status().await?;
        let meta = handle.file.meta.clone();
        let columns = meta
            .servers
            .iter()
            .map(|&id| {
                servers
                    .iter()
                    .find(|status| status.id == id)
                    .cloned()
                    .ok_or(ClientError::NoSuchServer(id))
            })
            .collect::<Result<Vec<ServerStatus>, ClientError>>()?;
        let view = FileView {
            meta,
            columns,
            missed: handle.file.missed.clone(),
        };
        let mut ctx = self.context_from(view)?;
        ctx.snapshot = Some(handle.epoch);
        Ok(ctx)
    }

    /// Removes snapshot `name`: its servers drop the copies no other snapshot reads, and the
    /// data of files removed before that only it held is deleted.
    pub async fn snapshot_remove(&self, name: &str) -> Result<SnapshotRemoval, ClientError> {
        let request = ManagerRequest::SnapshotRemove {
            name: name.to_string(),
        };
        let (snapshot, live, freed) = match self.manager_call(request).await? {
            ManagerResponse::SnapshotRemoved {
                snapshot,
                live,
                freed,
            } => (snapshot, live, freed),
            other => return Err(self.unexpected("a removed snapshot", other)),
        };
        let servers = self.status().await?;
        let live: BTreeMap<FileId, Vec<u64>> = live.into_iter().collect();
        let mut drops = Vec::new();
        for file in &snapshot.files {
            let kept = live.get(&file.meta.id).cloned().unwrap_or_default();
            for &server in &file.meta.servers {
                let request = StorageRequest::SnapshotDrop {
                    file: file.meta.id,
                    epoch: snapshot.epoch,
                    live: kept.clone(),
                };
                drops.push((server, request));
            }
        }
        let calls = drops.into_iter().map(|(server, request)| {
            let status = servers.iter().find(|s| s.id == server).cloned();
            async move {
                let Some(status) = status else {
                    return Some(server);
                };
                let addr = server_addr(&status).ok()?;
                match call_store(self, addr, status.incarnation, request, Bytes::new()).await {
                    Ok((StorageResponse::Done, _)) => None,
                    _ => Some(server),
                }
            }
        });
        let mut unreachable: Vec<ServerId> = futures::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect();
        unreachable.sort_unstable();
        unreachable.dedup();
        for meta in &freed {
            self.delete_data(meta, None).await?;
        }
        Ok(SnapshotRemoval {
            snapshot,
            freed_files: freed.len(),
            unreachable,
        })
    }

    /// Bytes the servers keep as snapshot copies of file `file` on `servers`; servers that
    /// do not answer are not counted.
    pub(crate) async fn snapshot_usage(&self, file: FileId, servers: &[ServerId]) -> u64 {
        let Ok(statuses) = self.status().await else {
            return 0;
        };
        let calls = servers.iter().filter_map(|id| {
            let status = statuses.iter().find(|s| s.id == *id)?;
            let addr = server_addr(status).ok()?;
            let request = StorageRequest::SnapshotUsage { file };
            Some(call_store(
                self,
                addr,
                status.incarnation,
                request,
                Bytes::new(),
            ))
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .map(|answer| match answer {
                Ok((StorageResponse::Usage { stored_bytes }, _)) => stored_bytes,
                _ => 0,
            })
            .sum()
    }
}

fn server_addr(status: &ServerStatus) -> Result<SocketAddr, ClientError> {
    status.addr.parse().map_err(|_| ClientError::Protocol {
        peer: format!("server {}", status.id),
        detail: format!("bad server address '{}'", status.addr),
    })
}
