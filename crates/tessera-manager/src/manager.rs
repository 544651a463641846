//! The manager state machine: requests in, responses out, the store as its memory.

#[path = "namespace.rs"]
pub(crate) mod namespace;

use crate::ranges;
use crate::store::{
    self, Failure, ServerRecord, Tables, DB_FILE_NAME, FORMAT_VERSION, ID_FIRST, KEY_CLUSTER_ID,
    KEY_DEBT_TAG_NEXT, KEY_FILE_ID_NEXT, KEY_FORMAT_VERSION, KEY_SERVER_ID_NEXT,
};
use redb::{Database, ReadableDatabase, ReadableTable, WriteTransaction};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tessera_layout::{Layout, WIDTH_MAX};
use tessera_wire::{
    ClusterId, FileDebt, FileId, FileMeta, FileView, IndexRange, LayoutRequest, ManagerError,
    ManagerRequest, ManagerResponse, MissedStripes, ServerId, ServerState, ServerStatus,
    ORPHANS_LISTED_MAX,
};

/// Default time without a heartbeat after which a server counts as down.
pub const HEARTBEAT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);
/// Default lease of a pending file: removed with its data if its writer neither renews nor
/// commits it for this long. Long enough for a `sync` of a large file between renewals (the
/// client renews at a third of it), short enough that a dead writer's bytes do not linger.
pub const PENDING_LEASE_DEFAULT: Duration = Duration::from_secs(60);
/// How long a replicated manager keeps a client's `once` answers after its last change:
/// far longer than a client retries (three rounds of the replicas, seconds each).
pub const ONCE_EXPIRY_DEFAULT: Duration = Duration::from_secs(600);
/// Longest path accepted, in bytes.
pub const PATH_BYTES_MAX: usize = 4096;

/// How the manager judges its servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManagerConfig {
    /// Time without a heartbeat after which a server counts as down.
    pub heartbeat_timeout: Duration,
    /// Time a pending file lives without a renewal or a commit.
    pub pending_lease: Duration,
    /// The id a store created now gets (`None`: drawn at random). A simulator passes one in so
    /// that a seed replays; an existing store keeps the id it has.
    pub cluster_id: Option<ClusterId>,
    /// What reserved streams may take of each server's link (admission control).
    pub links: crate::reservations::LinkCapacity,
    /// How long a replicated manager keeps the `once` answers of a client after its last
    /// change (see `command.rs`): longer than any client retries.
    pub once_expiry: Duration,
    /// Time a snapshot may stay created and not ready (its taker died between the two)
    /// before the manager removes it (`snapshot.rs`).
    pub snapshot_ready_lease: Duration,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            heartbeat_timeout: HEARTBEAT_TIMEOUT_DEFAULT,
            pending_lease: PENDING_LEASE_DEFAULT,
            cluster_id: None,
            links: crate::reservations::LinkCapacity::default(),
            once_expiry: ONCE_EXPIRY_DEFAULT,
            snapshot_ready_lease: crate::snapshot::SNAPSHOT_READY_LEASE_DEFAULT,
        }
    }
}

/// Why the manager's store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ManagerOpenError {
    /// The manager's directory could not be created.
    #[error("cannot create manager directory {path}: {error}")]
    CreateDir {
        /// Directory asked for.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The embedded store failed to open or to initialise.
    #[error("metadata store {path}: {error}")]
    Store {
        /// Database file.
        path: PathBuf,
        /// What redb said.
        error: redb::Error,
    },
    /// The store was written in a format version this build does not read.
    #[error(
        "metadata store {path} has format version {found}; this build reads version {expected}"
    )]
    UnknownFormat {
        /// Database file.
        path: PathBuf,
        /// Version found in the store.
        found: u64,
        /// Version this build reads.
        expected: u64,
    },
    /// A stored record could not be decoded.
    #[error("metadata store {path} holds an undecodable record: {error}")]
    Corrupt {
        /// Database file.
        path: PathBuf,
        /// What the decoder said.
        error: postcard::Error,
    },
    /// There is no store, and none may be created without being asked (`--init`): servers may
    /// hold a cluster's data that a new, empty store would disown.
    #[error(
        "no metadata store at {path}: start with --init for a new cluster, or rebuild a lost \
         store from the servers with `tessera manager recover`"
    )]
    NoStore {
        /// Database file expected.
        path: PathBuf,
    },
    /// The store's pages do not match their checksums (a flipped bit, a torn or lost write
    /// of the disk): it is not used, since what it holds may read as other metadata.
    #[error(
        "metadata store {path} is damaged ({detail}); it was not used: restore a copy, rebuild \
         it from the servers with `tessera manager recover` (move it aside first), or, for a \
         replica, start it on an empty directory to copy a peer's"
    )]
    Damaged {
        /// Database file.
        path: PathBuf,
        /// What the check found.
        detail: String,
    },
    /// Recovery never writes over a store that exists.
    #[error("a metadata store already exists at {path}; recovery writes only where there is none")]
    StoreExists {
        /// Database file.
        path: PathBuf,
    },
    /// The store's file could not be looked at, renamed or synced.
    #[error("metadata store {path}: {error}")]
    File {
        /// Database file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
}

/// The metadata manager: the namespace, file layouts, servers and what they owe.
///
/// Feed it every request with [`Manager::handle`] and call [`Manager::tick`] no later than
/// [`Manager::poll_timeout`] says, passing the current time to both; `handle` also expires
/// servers itself, so a late tick never lets a silent server look alive to a request.
/// Persistent state lives in the store and is committed before a mutating request is answered;
/// liveness lives in memory only, so after [`Manager::open`] every server is down until it
/// registers or heartbeats. Leases of pending files are in memory too: after `open` each
/// pending file gets a whole lease from the first tick.
pub struct Manager {
    /// Shared with a replica's batch sync, which runs without the manager (`command.rs`).
    pub(crate) db: std::sync::Arc<Database>,
    pub(crate) config: ManagerConfig,
    /// Where the store's file is, and which file it was when opened.
    store_file: StoreFile,
    /// Set once the store's file is found deleted or replaced: every later change is refused.
    store_lost: Option<ManagerError>,
    /// This cluster's id, drawn when the store was created.
    cluster: ClusterId,
    /// Copy of the `servers` table, updated after each commit that writes it.
    servers: BTreeMap<ServerId, ServerRecord>,
    /// Last heartbeat of every live server; a known server missing here is down.
    heartbeats: BTreeMap<ServerId, Instant>,
    /// Servers presumed live since [`Manager::presume_live`] and not heard since: in
    /// `heartbeats` (so that they time out as silent servers do), never placed on.
    presumed: BTreeSet<ServerId>,
    /// Servers owing stripes of at least one file, updated after each commit that writes debts.
    indebted: BTreeSet<ServerId>,
    /// Every pending file with the end of its lease (`None` until the first tick after open).
    pending: BTreeMap<FileId, Option<Instant>>,
    /// Every snapshot created and not ready, with the end of its lease (`None` until the
    /// first tick after open; see `snapshot.rs`).
    pub(crate) incomplete: BTreeMap<String, Option<Instant>>,
    /// Copy of the `access_keys` table (see `keys.rs`).
    pub(crate) access_keys: BTreeMap<tessera_auth::KeyId, crate::keys::AccessKeyRecord>,
    /// Set when this manager is one replica of several: pending files are then expired only
    /// by an ordered command, and access keys derive from this key (see `command.rs`).
    pub(crate) replica_key: Option<tessera_auth::Key>,
    /// What the replica that proposed the command being applied decided for it (placement,
    /// drawn key); empty outside [`Manager::apply`].
    pub(crate) decision: crate::command::Decision,
    /// A replica's place in the order, written with every commit (see `command.rs`).
    pub(crate) order_position: Option<crate::command::OrderPosition>,
    /// The last failure of the store itself (not a refusal) since it was taken: a replica
    /// stops on it (see `replica.rs`).
    store_failure: Option<String>,
    /// Set while a replica applies a delivered batch: commits are not synced one by one, and
    /// [`Manager::end_batch`] syncs them all at once (see `command.rs`).
    pub(crate) sync_deferred: bool,
    /// A commit of the batch asked for a sync that has not happened yet.
    pub(crate) sync_owed: bool,
    /// Commits synced to disk since the store was opened.
    pub(crate) synced_commits: u64,
    /// What a replica's local reads see while a batch's sync is owed (see `command.rs`).
    pub(crate) durable_reads: crate::command::DurableReads,
    /// The last `ExpireOnce` applied stopped at its bound (see `command.rs`).
    pub(crate) once_expiry_backlog: bool,
    /// Reserved streams admitted on the servers' links (soft state, see `reservations.rs`).
    reservations: crate::reservations::Reservations,
    /// Set by a `Once` request whose record joins its request's commit (`command.rs`):
    /// the next write leaves its transaction open in `held` instead of committing it.
    pub(crate) hold_commit: bool,
    /// A write's transaction left open (with its durability) for its `once` record.
    pub(crate) held: Option<(WriteTransaction, redb::Durability)>,
    /// Set while a batch's sync holds the batch's transaction and has not run
    /// (`command::BatchSync`).
    pub(crate) sync_holds_txn: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Tests: every commit fails as a full disk would.
    #[cfg(test)]
    pub(crate) fail_commits: bool,
}

/// The store at `path` is damaged: `detail` says how.
fn damaged(path: &Path, detail: String) -> ManagerOpenError {
    ManagerOpenError::Damaged {
        path: path.to_path_buf(),
        detail,
    }
}

/// What opening or checking the store at `path` failed with: damage if redb found the file
/// corrupt, else the store's error.
fn open_failed(path: &Path, error: redb::DatabaseError) -> ManagerOpenError {
    match error {
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(detail)) => {
            damaged(path, detail)
        }
        error => ManagerOpenError::Store {
            path: path.to_path_buf(),
            error: error.into(),
        },
    }
}

impl Manager {
    /// Opens the store at `dir/manager.redb`, creating it (a new cluster, with a new id) and
    /// `dir` if there is none: what `tessera manager --init` and a first `tessera up` do.
    pub fn open(dir: &Path, config: ManagerConfig) -> Result<Manager, ManagerOpenError> {
        std::fs::create_dir_all(dir).map_err(|error| ManagerOpenError::CreateDir {
            path: dir.to_path_buf(),
            error,
        })?;
        Self::open_at(&dir.join(DB_FILE_NAME), config)
    }

    /// Opens the database at `path` and checks every page of it against its checksum before
    /// anything is read: redb checks them only when it repairs a file after an unclean stop,
    /// so a bit flipped on disk in a cleanly closed store read as other metadata (a file's
    /// layout, a server's debts). A check that fails, or that had to roll the file back to
    /// an earlier commit (which would forget an acknowledged change), refuses the store.
    fn open_verified(path: &Path) -> Result<Database, ManagerOpenError> {
        // redb may panic on some damaged files rather than say so (a slice index out of
        // range, seen once in 8,000 flipped bits): that is a damaged store too, not a crash.
        let checked = std::panic::catch_unwind(|| Self::open_checked(path));
        checked.unwrap_or_else(|panic| {
            let what = (panic.downcast_ref::<String>().map(String::as_str))
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            Err(damaged(path, format!("redb failed reading it: {what}")))
        })
    }

    fn open_checked(path: &Path) -> Result<Database, ManagerOpenError> {
        // redb initializes a new database in an empty file: a store cut to nothing (a torn
        // copy, a file system that lost it) would open as a new cluster with no files.
        if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
            return Err(damaged(path, "it is empty".into()));
        }
        let mut db = Database::create(path).map_err(|error| open_failed(path, error))?;
        match db.check_integrity() {
            Ok(true) => Ok(db),
            Ok(false) => Err(damaged(
                path,
                "pages failed their checksums; redb rolled it back to an earlier commit".into(),
            )),
            Err(error) => Err(open_failed(path, error)),
        }
    }

    /// Opens the store at `dir/manager.redb` only if it exists; otherwise
    /// [`ManagerOpenError::NoStore`]. A manager that finds its store gone must not start a new
    /// cluster by itself (see the crate doc).
    pub fn open_existing(dir: &Path, config: ManagerConfig) -> Result<Manager, ManagerOpenError> {
        let path = dir.join(DB_FILE_NAME);
        match std::fs::symlink_metadata(&path) {
            Ok(_) => Self::open_at(&path, config),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                Err(ManagerOpenError::NoStore { path })
            }
            Err(error) => Err(ManagerOpenError::File { path, error }),
        }
    }

    fn open_at(path: &Path, config: ManagerConfig) -> Result<Manager, ManagerOpenError> {
        let db = Self::open_verified(path)?;
        let opened = (|| -> Result<_, Failure> {
            let Loaded {
                cluster,
                servers,
                indebted,
                pending,
            } = load(&db, config.cluster_id)?;
            let access_keys = crate::keys::load(&db)?;
            let incomplete = crate::snapshot::load_incomplete(&db)?;
            Ok((
                std::sync::Arc::new(db),
                cluster,
                servers,
                indebted,
                pending,
                access_keys,
                incomplete,
            ))
        })();
        let (db, cluster, servers, indebted, pending, access_keys, incomplete) =
            opened.map_err(|failure| {
                let path = path.to_path_buf();
                match failure {
                    Failure::Store(error) => ManagerOpenError::Store { path, error },
                    Failure::Codec(error) => ManagerOpenError::Corrupt { path, error },
                    Failure::UnknownFormat(found) => ManagerOpenError::UnknownFormat {
                        path,
                        found,
                        expected: FORMAT_VERSION,
                    },
                    Failure::Refused(error) => unreachable!("opening refused a request: {error}"),
                }
            })?;
        // Taken after opening, so it names the file the database really is.
        let store_file = StoreFile::identify(path).map_err(|error| ManagerOpenError::File {
            path: path.to_path_buf(),
            error,
        })?;
        Ok(Manager {
            access_keys,
            db,
            config,
            store_file,
            store_lost: None,
            cluster,
            servers,
            heartbeats: BTreeMap::new(),
            presumed: BTreeSet::new(),
            indebted,
            pending: pending.into_iter().map(|file| (file, None)).collect(),
            incomplete: incomplete.into_iter().map(|name| (name, None)).collect(),
            replica_key: None,
            decision: crate::command::Decision::default(),
            order_position: None,
            store_failure: None,
            sync_deferred: false,
            sync_owed: false,
            synced_commits: 0,
            durable_reads: crate::command::DurableReads::default(),
            once_expiry_backlog: false,
            reservations: crate::reservations::Reservations::new(config.links),
            hold_commit: false,
            held: None,
            sync_holds_txn: std::sync::Arc::default(),
            #[cfg(test)]
            fail_commits: false,
        })
    }

    /// Checks that the store's file is still the one opened: not deleted, not replaced by
    /// another file. The daemon calls it every tick, and every change calls it before it
    /// commits. Once the file is found gone, every later change is refused with
    /// [`ManagerError::StoreLost`] (committing into an unlinked file would acknowledge changes
    /// that vanish at the next start), the open store, still whole, is copied to
    /// `manager.redb.rescued-<inode>` beside it, and the finding is logged as an error, once.
    pub fn check_store(&mut self) -> Result<(), ManagerError> {
        if let Some(lost) = &self.store_lost {
            return Err(lost.clone());
        }
        let Some(what) = self.store_file.changed() else {
            return Ok(());
        };
        let lost = ManagerError::StoreLost {
            path: self.store_file.path.display().to_string(),
            what,
        };
        let rescued = self.store_file.rescue_path();
        let kept = match self.rescue(&rescued) {
            Ok(()) => format!(
                "everything it held (namespace, servers, debts) was copied to {}: stop the \
                 manager, move that file to {} and start it again",
                rescued.display(),
                self.store_file.path.display()
            ),
            Err(error) => format!(
                "it could not be copied to {} ({error}): once the manager is stopped, rebuild \
                 the store from the servers with `tessera manager recover`",
                rescued.display()
            ),
        };
        tracing::error!("{lost}; {kept}");
        self.store_lost = Some(lost.clone());
        Err(lost)
    }

    /// Copies the open store, still whole, to `path` (never over an existing file).
    fn rescue(&self, path: &Path) -> Result<(), ManagerError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| ManagerError::Store(e.to_string()))?;
        }
        if path.exists() {
            return Err(ManagerError::Store(format!("{} exists", path.display())));
        }
        store::copy_store(&self.db, path).map_err(ManagerError::from)
    }

    /// Answers one request at time `now`; a store failure is answered as
    /// [`ManagerError::Store`].
    pub fn handle(&mut self, request: ManagerRequest, now: Instant) -> ManagerResponse {
        self.tick(now);
        let answer = match request {
            ManagerRequest::Register {
                server,
                addr,
                incarnation,
                cluster,
            } => self
                .check_cluster(cluster)
                .and_then(|()| self.register(server, addr, incarnation, now)),
            ManagerRequest::Heartbeat {
                server,
                incarnation,
                cluster,
            } => self
                .check_cluster(Some(cluster))
                .and_then(|()| self.heartbeat(server, incarnation, now)),
            ManagerRequest::Create {
                path,
                layout,
                replace,
            } => self.create(path, layout, replace),
            ManagerRequest::Lookup { path } => self.lookup(&path),
            ManagerRequest::LookupId { file } => {
                self.renew(file, now);
                self.lookup_id(file)
            }
            ManagerRequest::List { prefix } => self.list(&prefix),
            ManagerRequest::Remove { path } => self.remove(&path),
            ManagerRequest::SetSize {
                file,
                size,
                grow_only,
            } => {
                self.renew(file, now);
                self.set_size(file, size, grow_only)
            }
            ManagerRequest::ReportMissed {
                server,
                file,
                stripes,
            } => self.report_missed(server, file, stripes),
            ManagerRequest::ReportDown { server } => self.report_down(server),
            ManagerRequest::Status => Ok(self.status()),
            ManagerRequest::Sync => self.write(|_| Ok(())).map(|()| ManagerResponse::Done),
            ManagerRequest::SyncFile { file, size } => {
                self.renew(file, now);
                self.sync_file(file, size)
            }
            ManagerRequest::FilesOnServer { server } => self.files_on_server(server),
            ManagerRequest::Resynced {
                server,
                file,
                stripes,
                tag,
            } => self.resynced(server, file, stripes, tag),
            ManagerRequest::CreatePending { path, layout } => {
                self.create_pending(path, layout, now)
            }
            ManagerRequest::RenewPending { file } => self.renew_pending(file, now),
            ManagerRequest::CommitPending { file } => self.commit_pending(file, None),
            ManagerRequest::CommitPendingSized { file, size } => {
                self.commit_pending(file, Some(size))
            }
            ManagerRequest::AbandonPending { file } => self.abandon_pending(file),
            ManagerRequest::Orphans { server } => self.orphans(server),
            ManagerRequest::OrphansRemoved { server, files } => {
                self.orphans_removed(server, &files)
            }
            ManagerRequest::KeyCreate { name } => {
                let drawn = self.drawn_key();
                self.key_create(name, drawn)
            }
            ManagerRequest::KeyList => Ok(self.key_list()),
            ManagerRequest::KeyRemove { key } => self.key_remove(key),
            ManagerRequest::StorageKeys => Ok(self.storage_keys()),
            ManagerRequest::Namespace(request) => self.namespace(request),
            ManagerRequest::Once {
                client,
                sequence,
                request,
            } => self.once(client, sequence, *request, now),
            ManagerRequest::Reserve {
                file,
                rate_bytes_per_s,
            } => self.reserve(file, rate_bytes_per_s, None, now),
            ManagerRequest::RenewReservation { id } => self
                .reservations
                .renew(id, now)
                .map(|()| ManagerResponse::Done)
                .map_err(Into::into),
            ManagerRequest::ReleaseReservation { id } => self
                .reservations
                .release(id)
                .map(|()| ManagerResponse::Done)
                .map_err(Into::into),
            ManagerRequest::SnapshotCreate { name, prefix } => {
                self.snapshot_create(name, prefix, now)
            }
            ManagerRequest::SnapshotReady { name } => self.snapshot_ready(name),
            ManagerRequest::SnapshotList { name } => self.snapshot_list(name),
            ManagerRequest::SnapshotRemove { name } => self.snapshot_remove(name),
            // A replica's own state and copies of its store are the daemon's (replica.rs).
            ManagerRequest::Replica
            | ManagerRequest::Snapshot { .. }
            | ManagerRequest::ReplicaChange { .. }
            | ManagerRequest::ReplicaGroup => {
                Err(ManagerError::Unordered("this manager is not replicated".into()).into())
            }
        };
        answer.unwrap_or_else(|failure| ManagerResponse::Error(failure.into()))
    }

    /// Marks down every server whose last heartbeat is `heartbeat_timeout` or more before `now`,
    /// and removes every pending file whose lease ended at or before `now` (its servers learn
    /// of it as an orphan). A pending file that cannot be removed now (the store failed) is
    /// tried again at the next tick.
    pub fn tick(&mut self, now: Instant) {
        self.reservations.expire(now);
        let timeout = self.config.heartbeat_timeout;
        self.heartbeats
            .retain(|_, last| now.saturating_duration_since(*last) < timeout);
        let heartbeats = &self.heartbeats;
        self.presumed
            .retain(|server| heartbeats.contains_key(server));
        let expired = self.expired_pending(now);
        // A replica's clock is its own: it proposes the expiry (`Command::ExpirePending`), and
        // every replica removes the file when it applies that, at one point of the order.
        if self.replica_key.is_some() {
            return;
        }
        // One transaction each, so that one file the store cannot remove holds up no other.
        for file in expired {
            self.expire_pending(file);
        }
        self.expire_snapshots(now);
    }

    /// The pending files whose lease ended at or before `now` (a file seen for the first time
    /// since open gets a whole lease from `now`).
    pub fn expired_pending(&mut self, now: Instant) -> Vec<FileId> {
        let lease = self.config.pending_lease;
        let mut expired = Vec::new();
        for (&file, deadline) in self.pending.iter_mut() {
            match deadline {
                None => *deadline = Some(now + lease),
                Some(end) if *end <= now => expired.push(file),
                Some(_) => {}
            }
        }
        expired
    }

    /// Removes a pending file whose lease ended; kept pending if the store failed.
    pub(crate) fn expire_pending(&mut self, file: FileId) {
        match self.write(|change| change.drop_pending(file)) {
            Ok(_) | Err(Failure::Refused(ManagerError::NotPending(_))) => {
                self.pending.remove(&file);
            }
            Err(_) => {}
        }
    }

    /// When the next server will time out if it stays silent, or the next pending file's lease
    /// ends: call [`Manager::tick`] then.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let heartbeat = self
            .heartbeats
            .values()
            .min()
            .map(|last| *last + self.config.heartbeat_timeout);
        let lease = self.pending.values().flatten().min().copied();
        let snapshot = self.incomplete.values().flatten().min().copied();
        heartbeat.into_iter().chain(lease).chain(snapshot).min()
    }

    /// The server registered from the store `incarnation` at `addr`, if any.
    fn server_of_store(&self, addr: &str, incarnation: u64) -> Option<ServerId> {
        self.servers
            .iter()
            .find(|(_, record)| record.incarnation == incarnation && record.addr == addr)
            .map(|(&server, _)| server)
    }

    /// How many servers are registered (live or not).
    pub fn known_servers(&self) -> usize {
        self.servers.len()
    }

    /// The live servers (Up or Stale), in id order, heard since the manager opened: where
    /// new files go.
    pub fn live_servers(&self) -> Vec<ServerId> {
        let heard = |server: &&ServerId| !self.presumed.contains(*server);
        self.heartbeats.keys().filter(heard).copied().collect()
    }

    /// Presumes every known server not heard yet live from `now` for one heartbeat timeout,
    /// in the state the store gives it (up, or stale while it owes stripes), unless it is
    /// reported down first: a replica that starts or installs a peer's store would otherwise
    /// call every server down, and refuse reads, until their heartbeats come through the
    /// order, though the group heard them all along. New files are placed only on servers
    /// heard here ([`Manager::live_servers`]).
    pub fn presume_live(&mut self, now: Instant) {
        for &server in self.servers.keys() {
            if let std::collections::btree_map::Entry::Vacant(entry) = self.heartbeats.entry(server)
            {
                entry.insert(now);
                self.presumed.insert(server);
            }
        }
    }

    /// Files waiting for their writer to commit them, in id order.
    pub fn pending_files(&self) -> Vec<FileId> {
        self.pending.keys().copied().collect()
    }

    /// A server's state as requests see it, or `None` for a server the manager does not know.
    pub fn server_state(&self, server: ServerId) -> Option<ServerState> {
        if !self.servers.contains_key(&server) {
            return None;
        }
        Some(if !self.heartbeats.contains_key(&server) {
            ServerState::Down
        } else if self.indebted.contains(&server) {
            ServerState::Stale
        } else {
            ServerState::Up
        })
    }

    pub(crate) fn server_status(&self, server: ServerId) -> ServerStatus {
        let record = self.servers.get(&server);
        ServerStatus {
            id: server,
            addr: record.map(|r| r.addr.clone()).unwrap_or_default(),
            // 0 for a server never registered: no store has it, so requests are refused.
            incarnation: record.map_or(0, |r| r.incarnation),
            state: self.server_state(server).unwrap_or(ServerState::Down),
        }
    }

    fn registered(&self, server: ServerId) -> ManagerResponse {
        let state = self.server_state(server);
        ManagerResponse::Registered {
            server,
            state: state.expect("a registered server is recorded before it is answered"),
            cluster: self.cluster,
        }
    }

    /// This cluster's id, which every server that joins remembers.
    pub fn cluster(&self) -> ClusterId {
        self.cluster
    }

    /// Refuses a server whose store joined another cluster: its manager's address was taken
    /// over by this one, and letting it in would put the other cluster's bytes under this
    /// cluster's file ids.
    fn check_cluster(&self, cluster: Option<ClusterId>) -> Result<(), Failure> {
        match cluster {
            Some(theirs) if theirs != self.cluster => Err(ManagerError::WrongCluster {
                ours: self.cluster,
                theirs,
            }
            .into()),
            _ => Ok(()),
        }
    }

    fn register(
        &mut self,
        server: Option<ServerId>,
        addr: String,
        incarnation: u64,
        now: Instant,
    ) -> Result<ManagerResponse, Failure> {
        let known = self.server_of_store(&addr, incarnation);
        let server = self.write(|change| {
            let server = match (server, known) {
                (Some(server), _) => {
                    change.raise_counter(KEY_SERVER_ID_NEXT, u64::from(server) + 1)?;
                    server
                }
                // The same store registering again (its first answer was lost, or it asked
                // another replica after a failover) keeps the id it was given.
                (None, Some(known)) => known,
                (None, None) => {
                    let next = change.take_counter(KEY_SERVER_ID_NEXT)?;
                    ServerId::try_from(next).map_err(|_| {
                        ManagerError::Store(format!("no server ids left (next would be {next})"))
                    })?
                }
            };
            let wiped = matches!(
                store::read_server(&change.tables.servers, server)?,
                Some(old) if old.incarnation != incarnation
            );
            if wiped {
                // The server lost everything it stored: it owes every stripe of its files.
                let whole = [IndexRange::new(0, u64::MAX)];
                for meta in store::read_files_on(&change.tables.files, server)? {
                    let tag = change.take_debt_tag()?;
                    change.set_debt(server, meta.id, &whole, tag)?;
                }
            }
            change.put_server(server, ServerRecord { addr, incarnation })?;
            Ok(server)
        })?;
        self.heartbeats.insert(server, now);
        self.presumed.remove(&server);
        Ok(self.registered(server))
    }

    fn heartbeat(
        &mut self,
        server: ServerId,
        incarnation: u64,
        now: Instant,
    ) -> Result<ManagerResponse, Failure> {
        let record = self
            .servers
            .get(&server)
            .ok_or(ManagerError::UnknownServer(server))?;
        if record.incarnation != incarnation {
            let addr = record.addr.clone();
            return self.register(Some(server), addr, incarnation, now);
        }
        self.heartbeats.insert(server, now);
        self.presumed.remove(&server);
        Ok(self.registered(server))
    }

    /// The layout a request asks for and the live servers (Up or Stale, in id order) to place
    /// it on, or why not.
    fn place(&self, request: &LayoutRequest) -> Result<(Layout, Vec<ServerId>), Failure> {
        // Replicas apply the proposer's judgement of which servers are live, not their own.
        let candidates: Vec<ServerId> = match &self.decision.placement {
            Some(decided) => decided.clone(),
            None => self.live_servers(),
        };
        let up = u32::try_from(candidates.len()).unwrap_or(u32::MAX);
        let width = request
            .width
            .unwrap_or_else(|| up.clamp(request.scheme.width_min(), WIDTH_MAX));
        // A malformed layout is refused before the cluster's size is consulted: asking again
        // later will not help it.
        let layout = Layout::new(request.scheme, request.stripe_unit, width)
            .map_err(|error| ManagerError::Layout(error.to_string()))?;
        if width > up {
            return Err(ManagerError::NotEnoughServers { wanted: width, up }.into());
        }
        Ok((layout, candidates))
    }

    fn create(
        &mut self,
        path: String,
        request: LayoutRequest,
        replace: bool,
    ) -> Result<ManagerResponse, Failure> {
        check_path(&path)?;
        let (layout, candidates) = self.place(&request)?;
        let meta = self.write(|change| {
            namespace::check_file_path(change, &path)?;
            if let Some(old) = change.file_id(&path)? {
                if !replace {
                    return Err(ManagerError::Exists(path).into());
                }
                if let Some(old) = store::read_file(&change.tables.files, old)? {
                    change.remove_file(&old)?;
                }
            }
            let meta = change.new_file(path, layout, &candidates)?;
            change.put_file(&meta)?;
            Ok(meta)
        })?;
        Ok(ManagerResponse::File(self.view(meta, Vec::new())))
    }

    /// A new file that takes `path` only when committed; until then no path names it.
    fn create_pending(
        &mut self,
        path: String,
        request: LayoutRequest,
        now: Instant,
    ) -> Result<ManagerResponse, Failure> {
        check_path(&path)?;
        let (layout, candidates) = self.place(&request)?;
        let meta = self.write(|change| {
            // Refused here, before any data moves; the commit checks again.
            namespace::check_file_path(change, &path)?;
            let meta = change.new_file(path, layout, &candidates)?;
            change.put_file_record(&meta)?;
            change.tables.pending.insert(meta.id, ())?;
            Ok(meta)
        })?;
        let lease = self.config.pending_lease;
        self.pending.insert(meta.id, Some(now + lease));
        Ok(ManagerResponse::Pending {
            view: self.view(meta, Vec::new()),
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// Moves a pending file's lease on to `now` plus a whole lease; nothing for other files.
    /// Whether `file` is pending (written for an atomic replace, not yet committed).
    pub(crate) fn is_pending(&self, file: FileId) -> bool {
        self.pending.contains_key(&file)
    }

    fn renew(&mut self, file: FileId, now: Instant) {
        if let Some(deadline) = self.pending.get_mut(&file) {
            *deadline = Some(now + self.config.pending_lease);
        }
    }

    fn renew_pending(&mut self, file: FileId, now: Instant) -> Result<ManagerResponse, Failure> {
        if !self.pending.contains_key(&file) {
            return Err(ManagerError::NotPending(file).into());
        }
        self.renew(file, now);
        Ok(ManagerResponse::Done)
    }

    /// Gives a pending file its path and removes the file that had it, in one transaction: a
    /// reader sees the old file whole or the new one whole, never neither.
    /// Gives a pending file its path (and, with `size`, that size exactly).
    fn commit_pending(
        &mut self,
        file: FileId,
        size: Option<u64>,
    ) -> Result<ManagerResponse, Failure> {
        let replaced = self.write(|change| {
            if change.tables.pending.remove(file)?.is_none() {
                return Err(ManagerError::NotPending(file).into());
            }
            let mut meta = store::read_file(&change.tables.files, file)?
                .ok_or_else(|| ManagerError::Store(format!("pending file {file} has no record")))?;
            if let Some(size) = size {
                check_size(&meta, size)?;
                meta.size = size;
            }
            namespace::check_file_path(change, &meta.path)?;
            let replaced = match change.file_id(&meta.path)? {
                Some(old) => store::read_file(&change.tables.files, old)?,
                None => None,
            };
            let replaced = match replaced {
                // Snapshots still hold it: its data is not to be deleted.
                Some(old) if change.remove_file(&old)? => None,
                replaced => replaced,
            };
            change.put_file(&meta)?;
            Ok(replaced)
        })?;
        self.pending.remove(&file);
        Ok(ManagerResponse::Committed { replaced })
    }

    fn abandon_pending(&mut self, file: FileId) -> Result<ManagerResponse, Failure> {
        let meta = self.write(|change| change.drop_pending(file))?;
        self.pending.remove(&file);
        Ok(ManagerResponse::Meta(meta))
    }

    /// Removed files whose data `server` may still hold.
    fn orphans(&self, server: ServerId) -> Result<ManagerResponse, Failure> {
        self.check_known(server)?;
        let txn = self.read_txn()?;
        let orphans = txn.open_table(store::ORPHANS)?;
        let mut files = Vec::new();
        for entry in orphans
            .range((server, FileId::MIN)..=(server, FileId::MAX))?
            .take(ORPHANS_LISTED_MAX)
        {
            files.push(entry?.0.value().1);
        }
        Ok(ManagerResponse::Orphans(files))
    }

    fn orphans_removed(
        &mut self,
        server: ServerId,
        files: &[FileId],
    ) -> Result<ManagerResponse, Failure> {
        self.check_known(server)?;
        if files.len() > ORPHANS_LISTED_MAX {
            return Err(ManagerError::Layout(format!(
                "{} orphans at once; at most {ORPHANS_LISTED_MAX} are listed",
                files.len()
            ))
            .into());
        }
        self.write(|change| {
            for &file in files {
                change.tables.orphans.remove((server, file))?;
            }
            Ok(())
        })?;
        Ok(ManagerResponse::Done)
    }

    fn lookup(&self, path: &str) -> Result<ManagerResponse, Failure> {
        let txn = self.read_txn()?;
        let paths = txn.open_table(store::PATHS)?;
        let Some(file) = paths.get(path)?.map(|id| id.value()) else {
            return Err(ManagerError::NotFound(path.to_string()).into());
        };
        self.lookup_id(file)
    }

    /// [`handle`](Self::handle) of a request from a client at `client` (its host's address,
    /// if known): a reservation is admitted on that host's link as well as the servers'.
    pub fn handle_from(
        &mut self,
        request: ManagerRequest,
        client: Option<IpAddr>,
        now: Instant,
    ) -> ManagerResponse {
        match (request, client) {
            (
                ManagerRequest::Reserve {
                    file,
                    rate_bytes_per_s,
                },
                Some(client),
            ) => {
                self.tick(now);
                self.reserve(file, rate_bytes_per_s, Some(client), now)
                    .unwrap_or_else(|failure| ManagerResponse::Error(failure.into()))
            }
            (request, _) => self.handle(request, now),
        }
    }

    /// Admits a stream of `file` at `rate` bytes/s if every server link it crosses has room,
    /// and the link of its client's host `client` if known (see `reservations.rs`).
    fn reserve(
        &mut self,
        file: FileId,
        rate: u64,
        client: Option<IpAddr>,
        now: Instant,
    ) -> Result<ManagerResponse, Failure> {
        let txn = self.db.begin_read()?;
        let files = txn.open_table(store::FILES)?;
        let meta = store::read_file(&files, file)?
            .ok_or_else(|| ManagerError::NotFound(file.to_string()))?;
        let mut links = crate::reservations::links_of(&meta, rate, |server| {
            self.servers.get(&server).map(|record| record.addr.clone())
        });
        if let Some(client) = client {
            links.push(crate::reservations::client_link(&links, client));
        }
        let id = self.reservations.admit(links, now)?;
        let lease_ms = crate::reservations::RESERVATION_LEASE.as_millis() as u64;
        Ok(ManagerResponse::Reserved { id, lease_ms })
    }

    fn lookup_id(&self, file: FileId) -> Result<ManagerResponse, Failure> {
        let txn = self.read_txn()?;
        let files = txn.open_table(store::FILES)?;
        let debts = txn.open_table(store::DEBTS)?;
        let meta = store::read_file(&files, file)?
            .ok_or_else(|| ManagerError::NotFound(file.to_string()))?;
        let mut missed = Vec::new();
        for &server in meta.servers.iter() {
            // Only servers that owe anything at all can owe stripes of this file (as of now:
            // a read of the durable state asks every server, see `command.rs`).
            if self.indebted.contains(&server) || self.durable_reads.pinned() {
                let stripes = store::read_debt(&debts, server, file)?;
                if !stripes.is_empty() {
                    missed.push(MissedStripes { server, stripes });
                }
            }
        }
        Ok(ManagerResponse::File(self.view(meta, missed)))
    }

    fn view(&self, meta: FileMeta, missed: Vec<MissedStripes>) -> FileView {
        let columns = meta
            .servers
            .iter()
            .map(|&server| self.server_status(server))
            .collect();
        FileView {
            meta,
            columns,
            missed,
        }
    }

    fn list(&self, prefix: &str) -> Result<ManagerResponse, Failure> {
        let txn = self.read_txn()?;
        let paths = txn.open_table(store::PATHS)?;
        let files = txn.open_table(store::FILES)?;
        let mut metas = Vec::new();
        // Paths sort bytewise, so those with the prefix are one run starting at the prefix.
        for entry in paths.range(prefix..)? {
            let (path, file) = entry?;
            if !path.value().starts_with(prefix) {
                break;
            }
            let meta = store::read_file(&files, file.value())?.ok_or_else(|| {
                ManagerError::Store(format!("path {} names a missing file", path.value()))
            })?;
            metas.push(meta);
        }
        Ok(ManagerResponse::Files(metas))
    }

    fn remove(&mut self, path: &str) -> Result<ManagerResponse, Failure> {
        let meta = self.write(|change| {
            let meta = match change.file_id(path)? {
                Some(file) => store::read_file(&change.tables.files, file)?,
                None => None,
            };
            let meta = meta.ok_or_else(|| ManagerError::NotFound(path.to_string()))?;
            let retained = change.remove_file(&meta)?;
            Ok((meta, retained))
        })?;
        Ok(match meta {
            (meta, false) => ManagerResponse::Meta(meta),
            (meta, true) => ManagerResponse::Retained(meta),
        })
    }

    fn set_size(
        &mut self,
        file: FileId,
        size: u64,
        grow_only: bool,
    ) -> Result<ManagerResponse, Failure> {
        // Growth from sequential writes is made durable by the next `Sync` (clients send one
        // when they sync data); everything else commits durably at once.
        let durability = if grow_only {
            redb::Durability::None
        } else {
            redb::Durability::Immediate
        };
        self.write_with(durability, |change| {
            let meta = store::read_file(&change.tables.files, file)?
                .ok_or_else(|| ManagerError::NotFound(file.to_string()))?;
            change.resize_file(meta, size, grow_only)
        })?;
        Ok(ManagerResponse::Done)
    }

    /// Makes every change durable, with `file` grown to at least `size`: a grow answered
    /// without sync and lost in a crash since is granted again, not acknowledged as synced
    /// with the size it no longer has. A file removed since is only synced.
    fn sync_file(&mut self, file: FileId, size: u64) -> Result<ManagerResponse, Failure> {
        self.write(
            |change| match store::read_file(&change.tables.files, file)? {
                Some(meta) => change.resize_file(meta, size, true),
                None => Ok(()),
            },
        )?;
        Ok(ManagerResponse::Done)
    }

    fn report_missed(
        &mut self,
        server: ServerId,
        file: FileId,
        stripes: IndexRange,
    ) -> Result<ManagerResponse, Failure> {
        self.check_known(server)?;
        self.write(|change| {
            let meta = store::read_file(&change.tables.files, file)?
                .ok_or_else(|| ManagerError::NotFound(file.to_string()))?;
            // A debt of a server outside the file would never be listed for rebuild, so it
            // could never be paid off.
            if !meta.servers.contains(&server) {
                return Err(ManagerError::Layout(format!(
                    "server {server} holds no column of file {file}"
                ))
                .into());
            }
            let debt = store::read_debt(&change.tables.debts, server, file)?;
            // A new tag even if the stripes were owed already: a rebuild that listed the debt
            // may have rebuilt them before this write skipped the server.
            let tag = change.take_debt_tag()?;
            change.set_debt(server, file, &ranges::merge(&debt, stripes), tag)
        })?;
        Ok(ManagerResponse::Done)
    }

    fn resynced(
        &mut self,
        server: ServerId,
        file: FileId,
        stripes: IndexRange,
        tag: u64,
    ) -> Result<ManagerResponse, Failure> {
        self.check_known(server)?;
        self.write(|change| {
            if store::read_file(&change.tables.files, file)?.is_none() {
                return Err(ManagerError::NotFound(file.to_string()).into());
            }
            let (debt, now) = store::read_debt_tagged(&change.tables.debts, server, file)?;
            if debt.is_empty() {
                return Ok(());
            }
            if now != tag {
                // A write skipped the server since the rebuild listed the debt: what the
                // rebuild wrote may be older than that write.
                return Err(ManagerError::DebtChanged { server, file }.into());
            }
            change.set_debt(server, file, &ranges::subtract(&debt, stripes), tag)
        })?;
        Ok(ManagerResponse::Done)
    }

    fn report_down(&mut self, server: ServerId) -> Result<ManagerResponse, Failure> {
        self.check_known(server)?;
        self.heartbeats.remove(&server);
        self.presumed.remove(&server);
        Ok(ManagerResponse::Done)
    }

    fn status(&self) -> ManagerResponse {
        let servers = self
            .servers
            .keys()
            .map(|&server| self.server_status(server))
            .collect();
        ManagerResponse::Servers(servers)
    }

    /// What each server owes, from the debts table alone (for metrics; one pass over the
    /// debts, whatever the number of files): by server, files owed whole (made while it was
    /// down, or its store wiped), and stripes of other files.
    pub fn owed(&self) -> Result<BTreeMap<ServerId, crate::metrics::Owed>, ManagerError> {
        Ok(self.read_owed()?)
    }

    fn read_owed(&self) -> Result<BTreeMap<ServerId, crate::metrics::Owed>, Failure> {
        let txn = self.db.begin_read()?;
        let debts = txn.open_table(store::DEBTS)?;
        let mut owed: BTreeMap<ServerId, crate::metrics::Owed> = self
            .servers
            .keys()
            .map(|&s| (s, Default::default()))
            .collect();
        for entry in debts.iter()? {
            let (key, record) = entry?;
            let (missed, _) = store::decode_debt(record.value())?;
            owed.entry(key.value().0).or_default().add(&missed);
        }
        Ok(owed)
    }

    fn files_on_server(&self, server: ServerId) -> Result<ManagerResponse, Failure> {
        self.check_known(server)?;
        let txn = self.read_txn()?;
        let files = txn.open_table(store::FILES)?;
        let debts = txn.open_table(store::DEBTS)?;
        let mut owed = Vec::new();
        for meta in store::read_files_on(&files, server)? {
            let (missed, tag) = store::read_debt_tagged(&debts, server, meta.id)?;
            owed.push(FileDebt { meta, missed, tag });
        }
        owed.sort_by(|a, b| a.meta.path.cmp(&b.meta.path));
        Ok(ManagerResponse::Debts(owed))
    }

    fn check_known(&self, server: ServerId) -> Result<(), Failure> {
        if self.servers.contains_key(&server) {
            Ok(())
        } else {
            Err(ManagerError::UnknownServer(server).into())
        }
    }

    /// Runs `apply` in one write transaction and commits it, then brings the in-memory copies of
    /// servers and debtors up to date. Nothing changes, in the store or in memory, if `apply`
    /// or the commit fails.
    pub(crate) fn write<T>(
        &mut self,
        apply: impl FnOnce(&mut Change<'_>) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        self.write_with(redb::Durability::Immediate, apply)
    }

    /// Make every earlier commit durable.
    pub fn flush(&mut self) -> Result<(), ManagerError> {
        self.write(|_| Ok(())).map_err(ManagerError::from)
    }

    pub(crate) fn write_with<T>(
        &mut self,
        durability: redb::Durability,
        apply: impl FnOnce(&mut Change<'_>) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let written = self.write_once(durability, apply);
        if let Err(Failure::Store(error)) = &written {
            self.store_failure = Some(error.to_string());
        }
        // A store file deleted or replaced under the manager refuses every change from then
        // on: to a replica, that is a failed store too (applying on would drift from the
        // others' stores), so it must stop rather than skip what the others commit.
        if let (Err(_), Some(lost)) = (&written, &self.store_lost) {
            self.store_failure = Some(lost.to_string());
        }
        written
    }

    /// Adds `extra` to the transaction a write left open (`held`) and commits it, recording
    /// a failure of the store as [`Manager::write_with`] does.
    pub(crate) fn commit_held(
        &mut self,
        held: (WriteTransaction, redb::Durability),
        extra: impl FnOnce(&WriteTransaction) -> Result<(), Failure>,
    ) -> Result<(), Failure> {
        let (txn, durability) = held;
        let committed = extra(&txn).and_then(|()| Ok(txn.commit()?));
        match &committed {
            Ok(()) if matches!(durability, redb::Durability::Immediate) => {
                self.synced_commits += 1;
            }
            Ok(()) => {}
            Err(failure) => self.held_failed(failure),
        }
        committed
    }

    /// Records `failure` of a held transaction as the store's: the request was applied, so
    /// a record that cannot be written is the store's failure too (the replica must not
    /// answer without it).
    fn held_failed(&mut self, failure: &Failure) {
        self.store_failure = Some(match failure {
            Failure::Store(error) => error.to_string(),
            other => format!("the once record: {other:?}"),
        });
    }

    /// Adds `extra` and the order position to the transaction a batch's writes left open
    /// (`held`) and leaves it open for the batch's next requests (the position again: a
    /// request refused before its write did not write it). A failure is the store's, as in
    /// [`Manager::commit_held`], and drops the transaction (the replica stops).
    pub(crate) fn add_to_held(
        &mut self,
        held: (WriteTransaction, redb::Durability),
        extra: impl FnOnce(&WriteTransaction) -> Result<(), Failure>,
    ) -> Result<(), Failure> {
        let (txn, durability) = held;
        let position = self.order_position;
        let added = extra(&txn).and_then(|()| match position {
            Some(position) => position.write(&mut txn.open_table(store::META)?),
            None => Ok(()),
        });
        match &added {
            Ok(()) => self.held = Some((txn, durability)),
            Err(failure) => self.held_failed(failure),
        }
        added
    }

    /// The store's own failure since the last call (a refusal is not one), if any.
    pub fn take_store_failure(&mut self) -> Option<String> {
        self.store_failure.take()
    }

    /// A new write transaction committed with `durability`.
    fn begin_write(&self, durability: redb::Durability) -> Result<WriteTransaction, Failure> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(durability)
            .map_err(|e| ManagerError::Store(e.to_string()))?;
        Ok(txn)
    }

    fn write_once<T>(
        &mut self,
        durability: redb::Durability,
        apply: impl FnOnce(&mut Change<'_>) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        // Only one write transaction at a time: one left open is committed first, unless this
        // write may share it (`crate::command::shares_batch_txn`).
        let shared = match self.held.take() {
            Some(held) if self.hold_commit && self.sync_deferred => Some(held),
            Some(held) => {
                self.commit_held(held, |_| Ok(()))?;
                None
            }
            None => None,
        };
        self.check_store()?;
        let durability = self.deferred(durability);
        let reused = shared.is_some();
        let (txn, durability) = match shared {
            Some(held) => held,
            None => (self.begin_write(durability)?, durability),
        };
        let position = self.order_position;
        let applied = (|| {
            let mut change = Change::new(&txn)?;
            let value = apply(&mut change)?;
            if let Some(position) = position {
                position.write(&mut change.tables.meta)?;
            }
            let debtors = change
                .debtors_touched
                .iter()
                .map(|&server| Ok((server, store::has_debt(&change.tables.debts, server)?)))
                .collect::<Result<Vec<_>, Failure>>()?;
            Ok((value, change.servers_written, debtors))
        })();
        let (value, servers, debtors) = match applied {
            Ok(applied) => applied,
            // A shared transaction holds the batch's earlier changes: a refusal wrote nothing
            // (those requests refuse before their first write), so it stays open for them.
            Err(Failure::Refused(error)) if reused => {
                self.hold_commit = false;
                self.held = Some((txn, durability));
                return Err(Failure::Refused(error));
            }
            Err(failure) => return Err(failure),
        };
        #[cfg(test)]
        if self.fail_commits {
            let full = std::io::Error::from_raw_os_error(28); // ENOSPC
            return Err(Failure::Store(redb::StorageError::Io(full).into()));
        }
        if std::mem::take(&mut self.hold_commit) {
            self.held = Some((txn, durability));
        } else {
            txn.commit()?;
            if matches!(durability, redb::Durability::Immediate) {
                self.synced_commits += 1;
            }
        }
        self.servers.extend(servers);
        for (server, indebted) in debtors {
            if indebted {
                self.indebted.insert(server);
            } else {
                self.indebted.remove(&server);
            }
        }
        Ok(value)
    }
}

/// The changes of one write transaction, remembering what the in-memory copies must learn once
/// it commits.
pub(crate) struct Change<'txn> {
    pub(crate) txn: &'txn WriteTransaction,
    pub(crate) tables: Tables<'txn>,
    servers_written: BTreeMap<ServerId, ServerRecord>,
    debtors_touched: BTreeSet<ServerId>,
}

impl<'txn> Change<'txn> {
    fn new(txn: &'txn WriteTransaction) -> Result<Change<'txn>, Failure> {
        Ok(Change {
            txn,
            tables: Tables::open(txn)?,
            servers_written: BTreeMap::new(),
            debtors_touched: BTreeSet::new(),
        })
    }

    /// The value of a counter, which then moves on by one.
    fn take_counter(&mut self, key: &str) -> Result<u64, Failure> {
        let value = read_counter(&self.tables.meta, key)?;
        let next = value
            .checked_add(1)
            .ok_or_else(|| ManagerError::Store(format!("counter {key} is exhausted")))?;
        self.tables.meta.insert(key, next)?;
        Ok(value)
    }

    /// A debt tag never handed out before (the counter starts at 1 in older stores).
    fn take_debt_tag(&mut self) -> Result<u64, Failure> {
        let tag = self
            .tables
            .meta
            .get(KEY_DEBT_TAG_NEXT)?
            .map_or(ID_FIRST, |value| value.value());
        let next = tag
            .checked_add(1)
            .ok_or_else(|| ManagerError::Store("debt tags are exhausted".into()))?;
        self.tables.meta.insert(KEY_DEBT_TAG_NEXT, next)?;
        Ok(tag)
    }

    /// Moves a counter up to at least `floor`, so that it never hands out an id already in use.
    fn raise_counter(&mut self, key: &str, floor: u64) -> Result<(), Failure> {
        if read_counter(&self.tables.meta, key)? < floor {
            self.tables.meta.insert(key, floor)?;
        }
        Ok(())
    }

    fn file_id(&self, path: &str) -> Result<Option<FileId>, Failure> {
        Ok(self.tables.paths.get(path)?.map(|file| file.value()))
    }

    /// A new file's metadata under a fresh id, placed over `candidates` (not yet stored).
    fn new_file(
        &mut self,
        path: String,
        layout: Layout,
        candidates: &[ServerId],
    ) -> Result<FileMeta, Failure> {
        assert!(
            candidates.len() >= layout.width as usize,
            "placed on too few servers"
        );
        let id = self.take_counter(KEY_FILE_ID_NEXT)?;
        // Start each file at a different column so that files spread over the servers.
        let start = (id % candidates.len() as u64) as usize;
        let servers = (0..layout.width as usize)
            .map(|column| candidates[(start + column) % candidates.len()])
            .collect();
        Ok(FileMeta {
            id,
            path,
            layout,
            servers,
            size: 0,
        })
    }

    /// Stores a file's record and names it by its path.
    fn put_file(&mut self, meta: &FileMeta) -> Result<(), Failure> {
        self.put_file_record(meta)?;
        self.tables.paths.insert(meta.path.as_str(), meta.id)?;
        Ok(())
    }

    /// Sets `meta`'s size to `size` (with `grow_only`, to at least `size`) within the file's
    /// largest, and writes its record.
    fn resize_file(
        &mut self,
        mut meta: FileMeta,
        size: u64,
        grow_only: bool,
    ) -> Result<(), Failure> {
        check_size(&meta, size)?;
        meta.size = if grow_only { meta.size.max(size) } else { size };
        self.put_file_record(&meta)
    }

    /// Stores a file's record only (a pending file has no path yet; a named one keeps its own).
    fn put_file_record(&mut self, meta: &FileMeta) -> Result<(), Failure> {
        let record = postcard::to_allocvec(meta)?;
        self.tables.files.insert(meta.id, record.as_slice())?;
        Ok(())
    }

    /// Removes a file from the namespace together with everything its servers owe of it, and
    /// records it as an orphan on each of its servers, which delete its data when they next
    /// ask. Its path is freed only if it names this file (a pending file's path names another).
    /// A file that snapshots hold only leaves the namespace: its record, debts and data stay
    /// until the last of them is removed (answered `true`, see `snapshot.rs`).
    pub(crate) fn remove_file(&mut self, meta: &FileMeta) -> Result<bool, Failure> {
        if self.file_id(&meta.path)? == Some(meta.id) {
            self.tables.paths.remove(meta.path.as_str())?;
        }
        self.tables.pending.remove(meta.id)?;
        if self.retain_if_held(meta)? {
            return Ok(true);
        }
        self.tables.files.remove(meta.id)?;
        self.txn.open_table(namespace::TIMES)?.remove(meta.id)?;
        self.txn
            .open_table(namespace::ACCESS_CHANGE)?
            .remove(meta.id)?;
        for &server in &meta.servers {
            self.set_debt(server, meta.id, &[], 0)?;
            self.tables.orphans.insert((server, meta.id), ())?;
        }
        Ok(false)
    }

    /// Removes a pending file (abandoned, or its lease ended), answering its metadata.
    fn drop_pending(&mut self, file: FileId) -> Result<FileMeta, Failure> {
        if self.tables.pending.get(file)?.is_none() {
            return Err(ManagerError::NotPending(file).into());
        }
        let meta = store::read_file(&self.tables.files, file)?
            .ok_or_else(|| ManagerError::Store(format!("pending file {file} has no record")))?;
        self.remove_file(&meta)?;
        Ok(meta)
    }

    fn put_server(&mut self, server: ServerId, record: ServerRecord) -> Result<(), Failure> {
        self.tables
            .servers
            .insert(server, postcard::to_allocvec(&record)?.as_slice())?;
        self.servers_written.insert(server, record);
        Ok(())
    }

    /// Records what `server` owes of `file`, under `tag`; an empty list removes the debt.
    fn set_debt(
        &mut self,
        server: ServerId,
        file: FileId,
        stripes: &[IndexRange],
        tag: u64,
    ) -> Result<(), Failure> {
        assert!(ranges::is_normal(stripes), "debt not normal: {stripes:?}");
        if stripes.is_empty() {
            self.tables.debts.remove((server, file))?;
        } else {
            let record = store::encode_debt(stripes, tag)?;
            self.tables
                .debts
                .insert((server, file), record.as_slice())?;
        }
        self.debtors_touched.insert(server);
        Ok(())
    }
}

/// Refuses a size past the largest a file of `meta`'s layout can have.
fn check_size(meta: &FileMeta, size: u64) -> Result<(), Failure> {
    let max = meta.layout.file_bytes_max();
    if size > max {
        let what = format!("size {size} of file {}", meta.id);
        return Err(ManagerError::TooLarge { what, max }.into());
    }
    Ok(())
}

fn read_counter(meta: &impl ReadableTable<&'static str, u64>, key: &str) -> Result<u64, Failure> {
    meta.get(key)?
        .map(|value| value.value())
        .ok_or_else(|| ManagerError::Store(format!("counter {key} is missing")).into())
}

/// The store's file, as the device and inode it was when opened.
struct StoreFile {
    path: PathBuf,
    device: u64,
    inode: u64,
}

impl StoreFile {
    fn identify(path: &Path) -> std::io::Result<StoreFile> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        Ok(StoreFile {
            path: path.to_path_buf(),
            device: meta.dev(),
            inode: meta.ino(),
        })
    }

    /// Where a copy of the store is kept when its file is lost: named after the lost file's
    /// inode, so that it never overwrites an earlier rescue.
    fn rescue_path(&self) -> PathBuf {
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".rescued-{}", self.inode));
        self.path.with_file_name(name)
    }

    /// What happened to the file since it was opened, if anything.
    fn changed(&self) -> Option<String> {
        match StoreFile::identify(&self.path) {
            Ok(now) if (now.device, now.inode) == (self.device, self.inode) => None,
            Ok(now) => Some(format!(
                "replaced by another file (inode {} on device {:#x}, was {} on {:#x})",
                now.inode, now.device, self.inode, self.device
            )),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                Some("deleted".to_string())
            }
            Err(error) => Some(format!("made unreachable ({error})")),
        }
    }
}

/// What the manager keeps in memory from its store.
struct Loaded {
    cluster: ClusterId,
    servers: BTreeMap<ServerId, ServerRecord>,
    /// The servers that owe stripes.
    indebted: BTreeSet<ServerId>,
    /// The pending files.
    pending: Vec<FileId>,
}

/// Initialises a fresh store or checks an existing one's version, then reads what the manager
/// keeps in memory: the cluster id, the servers and which of them owe stripes.
fn load(db: &Database, new_cluster: Option<ClusterId>) -> Result<Loaded, Failure> {
    let txn = db.begin_write()?;
    let loaded = {
        let mut tables = Tables::open(&txn)?;
        let version = tables.meta.get(KEY_FORMAT_VERSION)?.map(|v| v.value());
        match version {
            Some(FORMAT_VERSION) => {}
            Some(found) => return Err(Failure::UnknownFormat(found)),
            None => {
                tables.meta.insert(KEY_FORMAT_VERSION, FORMAT_VERSION)?;
                tables.meta.insert(KEY_FILE_ID_NEXT, ID_FIRST)?;
                tables.meta.insert(KEY_SERVER_ID_NEXT, ID_FIRST)?;
            }
        }
        // Stores from before cluster ids get one now.
        let stored = tables.meta.get(KEY_CLUSTER_ID)?.map(|v| v.value());
        let cluster = match stored {
            Some(cluster) => cluster,
            None => {
                let cluster = new_cluster.unwrap_or_else(rand::random::<u64>).max(1);
                tables.meta.insert(KEY_CLUSTER_ID, cluster)?;
                cluster
            }
        };
        let mut servers = BTreeMap::new();
        for entry in tables.servers.iter()? {
            let (server, record) = entry?;
            servers.insert(server.value(), postcard::from_bytes(record.value())?);
        }
        let mut indebted = BTreeSet::new();
        for entry in tables.debts.iter()? {
            let (key, _) = entry?;
            indebted.insert(key.value().0);
        }
        let mut pending = Vec::new();
        for entry in tables.pending.iter()? {
            pending.push(entry?.0.value());
        }
        Loaded {
            cluster,
            servers,
            indebted,
            pending,
        }
    };
    txn.commit()?;
    Ok(loaded)
}

/// The answer of a manager that has no store (see [`Manager::open_existing`]) to any request:
/// [`ManagerError::NoStore`], naming the cluster a registering or heartbeating server's store
/// joined, so that its log tells the operator what was lost and how to recover it.
pub fn refuse_without_store(store: &Path, request: &ManagerRequest) -> ManagerResponse {
    let cluster = match request {
        ManagerRequest::Register { cluster, .. } => *cluster,
        ManagerRequest::Heartbeat { cluster, .. } => Some(*cluster),
        _ => None,
    };
    ManagerResponse::Error(ManagerError::NoStore {
        path: store.display().to_string(),
        cluster,
    })
}

/// Refuses paths the namespace cannot hold.
fn check_path(path: &str) -> Result<(), Failure> {
    let problem = if path.is_empty() {
        "path is empty".to_string()
    } else if path.contains('\0') {
        "path contains a NUL byte".to_string()
    } else if path.len() > PATH_BYTES_MAX {
        format!(
            "path is {} bytes long; at most {PATH_BYTES_MAX} are allowed",
            path.len()
        )
    } else if path.split('/').any(|name| name == "." || name == "..") {
        // Such a name means a different path to every interface (the mount, a shell, S3),
        // and a mount's directory listing cannot show it.
        format!("path '{path}' has a '.' or '..' component")
    } else {
        return Ok(());
    };
    Err(ManagerError::Layout(problem).into())
}
