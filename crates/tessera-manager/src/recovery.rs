//! Rebuilding a lost store from what the storage servers keep (`tessera manager recover`).
//!
//! Each server keeps, per file it holds a column of, a record of the file's metadata
//! (`tessera_store::FileRecord`), and in its `store.toml` its own id, store incarnation and
//! cluster. [`merge`] turns the servers' reports into the contents of a new store, and
//! [`write_store`] writes them where the manager will open them. Both are deterministic: the
//! network part (asking each server) is the caller's.
//!
//! Rules of the merge:
//! - every server that reports must name the same cluster; that cluster's id is kept, so that
//!   the servers are accepted again as they are;
//! - a file's layout and servers never change after it is created, so its records must agree
//!   on them (a file whose records disagree is refused, named in the error);
//! - a file no record saw committed (the new file of an interrupted `put`, see
//!   `tessera_store::FileRecord::committed`) gets no path, so the file it was to replace stays;
//!   its data is listed as orphaned, and its servers delete it;
//! - its size is the largest any record holds, and its path the one most records hold (ties:
//!   the smallest path, so that the choice does not depend on the order of the reports);
//! - two files claiming one path (a file replaced while one of its servers was down keeps
//!   the old record there): the newest, the higher id, keeps the path, the other is kept at
//!   `lost+found/<id>` rather than dropped;
//! - every server named by a file must have reported (its address and incarnation are known
//!   only from it), so that no column points at a server the manager cannot reach;
//! - the next file id is above every id seen, also of files stored with a damaged record or
//!   none (left out of the namespace, and named in the notes), the next server id above every
//!   server's.
//!
//! What cannot be recovered: stripes a server missed while down (its debt lives only in the
//! manager's store), so a recovered cluster believes every server whole (rebuild and scrub
//! what was degraded before); a size change no server recorded yet (records are renewed at
//! creation and at each sync); files removed while one of their servers was down come back
//! from that server's record.

use crate::manager::ManagerOpenError;
use crate::store::{
    Tables, DB_FILE_NAME, FORMAT_VERSION, KEY_CLUSTER_ID, KEY_FILE_ID_NEXT, KEY_FORMAT_VERSION,
    KEY_SERVER_ID_NEXT,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use tessera_auth::{Key, KeyId};
use tessera_wire::{ClusterId, FileId, FileMeta, Incarnation, ServerId};

/// How far past the highest reported file id a recovered manager starts handing out ids:
/// files created and removed after the newest surviving one left tombstones on their
/// servers under ids nobody reports, and a new file given one of them could not be written.
/// Ids are 64-bit and only need to be unique, so skipping 2^32 of them costs nothing.
pub const RECOVERED_FILE_ID_GAP: u64 = 1 << 32;

/// What one server said about itself and its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerReport {
    /// The address it was reached at (kept as its address).
    pub addr: String,
    /// Its id, if it ever registered.
    pub server: Option<ServerId>,
    /// Its store's incarnation.
    pub incarnation: Incarnation,
    /// The cluster its store joined, if any.
    pub cluster: Option<ClusterId>,
    /// Its file records.
    pub records: Vec<FileMeta>,
    /// Files whose record on it is damaged.
    pub damaged: Vec<FileId>,
    /// Files it stores without a record.
    pub unrecorded: Vec<FileId>,
    /// Files among `records` it never saw committed (a `put` under way or interrupted).
    pub uncommitted: Vec<FileId>,
}

/// A recovered server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredServer {
    /// Its id.
    pub id: ServerId,
    /// Its address.
    pub addr: String,
    /// Its store's incarnation.
    pub incarnation: Incarnation,
}

/// The contents of a recovered store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// The cluster's id, as every server remembers it.
    pub cluster: ClusterId,
    /// The servers, by id.
    pub servers: Vec<RecoveredServer>,
    /// The files, by id.
    pub files: Vec<FileMeta>,
    /// Files no server saw committed: an interrupted `put`'s new file. They get no path; their
    /// data is listed as orphaned on their servers, which delete it.
    pub abandoned: Vec<FileMeta>,
    /// The next file id to hand out: [`RECOVERED_FILE_ID_GAP`] above every id any server
    /// reported, recorded or not, so that a new file never meets bytes left under its id,
    /// nor a tombstone of a file removed after the last one that survives (servers refuse
    /// writes to a removed id, and report only the files they hold).
    pub file_id_next: FileId,
    /// What the operator should know: files moved to `lost+found/`, damaged records, servers
    /// that never joined.
    pub notes: Vec<String>,
    /// Access keys to put back (id, name, secret): the servers never hold them, so only those
    /// the operator still has (the local cluster's, from its `cluster.toml`) survive the store.
    pub access_keys: Vec<(KeyId, String, Key)>,
}

/// Why the servers' reports do not make a store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    /// No server that answered has joined a cluster.
    #[error("no server that answered has joined a cluster: there is nothing to recover")]
    NoCluster,
    /// The servers belong to different clusters.
    #[error("the servers belong to different clusters: {0}")]
    MixedClusters(String),
    /// Two addresses answered as the same server id.
    #[error("server {server} answered at both {first} and {second}")]
    DuplicateServer {
        /// The id.
        server: ServerId,
        /// One address.
        first: String,
        /// The other.
        second: String,
    },
    /// Files have columns on servers that did not report.
    #[error(
        "files have columns on servers {missing:?}, which did not answer: start them and name \
         their addresses too"
    )]
    MissingServers {
        /// The servers not heard from.
        missing: Vec<ServerId>,
    },
    /// A file's records disagree on what never changes.
    #[error("the records of file {file} disagree on its layout or servers: {detail}")]
    Conflict {
        /// The file.
        file: FileId,
        /// The two versions.
        detail: String,
    },
}

/// Merges the servers' reports into a store's contents (see the module doc for the rules).
pub fn merge(reports: &[ServerReport]) -> Result<Recovered, RecoveryError> {
    let mut notes = Vec::new();
    let cluster = the_cluster(reports, &mut notes)?;
    let servers = the_servers(reports)?;
    let mut files: BTreeMap<FileId, Merging> = BTreeMap::new();
    for report in reports.iter().filter(|r| r.cluster == Some(cluster)) {
        for meta in &report.records {
            let committed = !report.uncommitted.contains(&meta.id);
            files.entry(meta.id).or_default().add(meta, committed)?;
        }
        for file in &report.damaged {
            notes.push(format!(
                "server at {} has a damaged record of file {file}",
                report.addr
            ));
        }
    }
    let file_id_next = reports
        .iter()
        .flat_map(|r| {
            let recorded = r.records.iter().map(|meta| meta.id);
            recorded
                .chain(r.damaged.iter().copied())
                .chain(r.unrecorded.iter().copied())
        })
        .max()
        .map_or(1, |id| id.saturating_add(RECOVERED_FILE_ID_GAP));
    let recorded: BTreeSet<FileId> = files.keys().copied().collect();
    let unrecorded: BTreeSet<FileId> = reports
        .iter()
        .flat_map(|r| r.damaged.iter().chain(&r.unrecorded).copied())
        .filter(|id| !recorded.contains(id))
        .collect();
    if !unrecorded.is_empty() {
        notes.push(format!(
            "files {:?} are stored without a whole record anywhere: left out of the \
             namespace (their ids are not reused)",
            unrecorded.iter().collect::<Vec<_>>()
        ));
    }
    let (committed, uncommitted): (Vec<Merging>, Vec<Merging>) =
        files.into_values().partition(|merging| merging.committed);
    let mut files: Vec<FileMeta> = committed.into_iter().map(Merging::finish).collect();
    let abandoned: Vec<FileMeta> = uncommitted.into_iter().map(Merging::finish).collect();
    if !abandoned.is_empty() {
        notes.push(format!(
            "files {:?} were never committed (interrupted puts): left out, their data deleted",
            abandoned.iter().map(|meta| meta.id).collect::<Vec<_>>()
        ));
    }
    let known: BTreeSet<ServerId> = servers.iter().map(|s| s.id).collect();
    let missing: BTreeSet<ServerId> = files
        .iter()
        .chain(&abandoned)
        .flat_map(|meta| meta.servers.iter().copied())
        .filter(|server| !known.contains(server))
        .collect();
    if !missing.is_empty() {
        return Err(RecoveryError::MissingServers {
            missing: missing.into_iter().collect(),
        });
    }
    give_paths_one_owner(&mut files, &mut notes);
    Ok(Recovered {
        cluster,
        servers,
        files,
        abandoned,
        file_id_next,
        notes,
        access_keys: Vec::new(),
    })
}

/// The one cluster every report that joined one names.
fn the_cluster(
    reports: &[ServerReport],
    notes: &mut Vec<String>,
) -> Result<ClusterId, RecoveryError> {
    let clusters: BTreeSet<ClusterId> = reports.iter().filter_map(|r| r.cluster).collect();
    for report in reports.iter().filter(|r| r.cluster.is_none()) {
        notes.push(format!(
            "server at {} never joined a cluster; left out",
            report.addr
        ));
    }
    match clusters.len() {
        0 => Err(RecoveryError::NoCluster),
        1 => Ok(*clusters.first().expect("one cluster")),
        _ => Err(RecoveryError::MixedClusters(
            reports
                .iter()
                .filter_map(|r| Some(format!("{} in {:#x}", r.addr, r.cluster?)))
                .collect::<Vec<_>>()
                .join(", "),
        )),
    }
}

fn the_servers(reports: &[ServerReport]) -> Result<Vec<RecoveredServer>, RecoveryError> {
    let mut servers: BTreeMap<ServerId, RecoveredServer> = BTreeMap::new();
    for report in reports.iter().filter(|r| r.cluster.is_some()) {
        let Some(id) = report.server else { continue };
        if let Some(first) = servers.get(&id) {
            return Err(RecoveryError::DuplicateServer {
                server: id,
                first: first.addr.clone(),
                second: report.addr.clone(),
            });
        }
        servers.insert(
            id,
            RecoveredServer {
                id,
                addr: report.addr.clone(),
                incarnation: report.incarnation,
            },
        );
    }
    Ok(servers.into_values().collect())
}

/// The records of one file, as they are merged.
#[derive(Default)]
struct Merging {
    first: Option<FileMeta>,
    size: u64,
    /// Whether any record saw the file committed.
    committed: bool,
    /// How many records name each path.
    paths: BTreeMap<String, usize>,
}

impl Merging {
    fn add(&mut self, meta: &FileMeta, committed: bool) -> Result<(), RecoveryError> {
        if meta.servers.len() != meta.layout.width as usize || meta.path.is_empty() {
            return Err(RecoveryError::Conflict {
                file: meta.id,
                detail: format!(
                    "a record names {} servers for width {} and path {:?}",
                    meta.servers.len(),
                    meta.layout.width,
                    meta.path
                ),
            });
        }
        if let Some(first) = &self.first {
            if (first.layout, &first.servers) != (meta.layout, &meta.servers) {
                return Err(RecoveryError::Conflict {
                    file: meta.id,
                    detail: format!(
                        "{:?} on {:?} against {:?} on {:?}",
                        first.layout, first.servers, meta.layout, meta.servers
                    ),
                });
            }
        } else {
            self.first = Some(meta.clone());
        }
        self.size = self.size.max(meta.size);
        self.committed |= committed;
        *self.paths.entry(meta.path.clone()).or_default() += 1;
        Ok(())
    }

    fn finish(self) -> FileMeta {
        let most = self.paths.values().copied().max().unwrap_or(0);
        // The first path (in order) of those most records name.
        let path = self
            .paths
            .into_iter()
            .find(|(_, count)| *count == most)
            .map(|(path, _)| path)
            .expect("a merged file has a record");
        FileMeta {
            path,
            size: self.size,
            ..self.first.expect("a merged file has a record")
        }
    }
}

/// Leaves each path to its newest file (the highest id) and moves the others to
/// `lost+found/<id>`.
fn give_paths_one_owner(files: &mut [FileMeta], notes: &mut Vec<String>) {
    let mut owner: BTreeMap<String, FileId> = BTreeMap::new();
    for meta in files.iter() {
        let newest = owner.entry(meta.path.clone()).or_insert(meta.id);
        *newest = (*newest).max(meta.id);
    }
    for meta in files.iter_mut() {
        if owner[&meta.path] != meta.id {
            let moved = format!("lost+found/{}", meta.id);
            notes.push(format!(
                "file {} claimed {} too (file {} is newer there); kept as {moved}",
                meta.id, meta.path, owner[&meta.path]
            ));
            meta.path = moved;
        }
    }
}

/// Writes a recovered store to `dir/manager.redb`: built in a file of its own, committed
/// durably, then renamed into place, so that a manager waiting for its store never opens a
/// half-written one. Refuses to replace a store that exists.
pub fn write_store(dir: &Path, recovered: &Recovered) -> Result<(), ManagerOpenError> {
    let path = dir.join(DB_FILE_NAME);
    if std::fs::symlink_metadata(&path).is_ok() {
        return Err(ManagerOpenError::StoreExists { path });
    }
    std::fs::create_dir_all(dir).map_err(|error| ManagerOpenError::CreateDir {
        path: dir.to_path_buf(),
        error,
    })?;
    let building = dir.join(format!("{DB_FILE_NAME}.recovering"));
    let file_error = |error| ManagerOpenError::File {
        path: building.clone(),
        error,
    };
    match std::fs::remove_file(&building) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(file_error(error))
        }
        _ => {}
    }
    fill(&building, recovered).map_err(|error| ManagerOpenError::Store {
        path: building.clone(),
        error,
    })?;
    std::fs::rename(&building, &path).map_err(file_error)?;
    std::fs::File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(|error| ManagerOpenError::File { path, error })
}

/// Fills a new database at `path` with the recovered contents, in one durable commit.
fn fill(path: &Path, recovered: &Recovered) -> Result<(), redb::Error> {
    let db = redb::Database::create(path)?;
    let txn = db.begin_write()?;
    {
        let mut tables = Tables::open(&txn).map_err(|failure| match failure {
            crate::store::Failure::Store(error) => error,
            other => unreachable!("opening tables fails only in redb: {other:?}"),
        })?;
        let file_next = recovered.file_id_next;
        assert!(
            recovered.files.iter().all(|meta| meta.id < file_next),
            "the next file id is above every file's"
        );
        let server_next = recovered
            .servers
            .iter()
            .map(|s| u64::from(s.id) + 1)
            .max()
            .unwrap_or(1);
        tables.meta.insert(KEY_FORMAT_VERSION, FORMAT_VERSION)?;
        tables.meta.insert(KEY_FILE_ID_NEXT, file_next)?;
        tables.meta.insert(KEY_SERVER_ID_NEXT, server_next)?;
        tables.meta.insert(KEY_CLUSTER_ID, recovered.cluster)?;
        for server in &recovered.servers {
            let record = crate::store::ServerRecord {
                addr: server.addr.clone(),
                incarnation: server.incarnation,
            };
            let bytes = postcard::to_allocvec(&record).expect("a server record encodes");
            tables.servers.insert(server.id, bytes.as_slice())?;
        }
        for meta in &recovered.files {
            let bytes = postcard::to_allocvec(meta).expect("a file record encodes");
            tables.files.insert(meta.id, bytes.as_slice())?;
            tables.paths.insert(meta.path.as_str(), meta.id)?;
        }
        for (id, name, key) in &recovered.access_keys {
            crate::keys::insert(&txn, *id, name, *key)?;
        }
        // As for a removed file: each server deletes the data once it hears of it.
        for meta in &recovered.abandoned {
            for &server in &meta.servers {
                tables.orphans.insert((server, meta.id), ())?;
            }
        }
    }
    txn.commit()?;
    Ok(())
}
