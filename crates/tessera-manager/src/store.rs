//! The manager's tables in redb, the encoding of their records, and the failures of using them.
//!
//! Layout of format version 1 (records are postcard-encoded):
//!
//! ```text
//! meta:    &str                -> u64              format_version, file_id_next, server_id_next,
//!                                                  cluster_id
//! files:   FileId              -> FileMeta
//! paths:   &str                -> FileId           the namespace, an index into `files`
//! servers: ServerId            -> ServerRecord
//! debts:   (ServerId, FileId)  -> Vec<IndexRange>  normal (see `ranges`), never empty; then
//!                                                  the debt's tag (u64, see `read_debt_tagged`)
//! pending: FileId              -> ()               files written for an atomic replace: in
//!                                                  `files`, not yet in `paths`
//! orphans: (ServerId, FileId)  -> ()               removed files whose data the server may
//!                                                  still hold, until it says it deleted them
//! ```
//!
//! A debt's tag changes with every miss reported for it (it is drawn from the counter
//! `debt_tag_next` in `meta`, so no tag is handed out twice); a rebuild's `Resynced` names the
//! tag it listed. Both extend version 1 compatibly: a record without a tag has tag 0 (postcard
//! ignores bytes after the ranges, so an older build reads the newer records), and a missing
//! counter starts at 1.
//!
//! `pending` and `orphans` extend version 1 compatibly: they are created when missing, and a
//! store without them has no pending files and no orphans. A pending file's `FileMeta::path`
//! is the path it will take; only `paths` says which file a path names.

use redb::{
    Database, Key, ReadTransaction, ReadableDatabase, ReadableTable, Table, TableDefinition, Value,
    WriteTransaction,
};
use serde::{Deserialize, Serialize};
use tessera_wire::{FileId, FileMeta, IndexRange, ManagerError, ServerId};

/// File name of the database inside the manager's directory.
pub(crate) const DB_FILE_NAME: &str = "manager.redb";
/// Version of the table layout and record encodings this build reads and writes.
pub(crate) const FORMAT_VERSION: u64 = 1;

/// Key in `meta` of the format version.
pub(crate) const KEY_FORMAT_VERSION: &str = "format_version";
/// Key in `meta` of the next file id to hand out.
pub(crate) const KEY_FILE_ID_NEXT: &str = "file_id_next";
/// Key in `meta` of the cluster's id (random, drawn when the store is created).
pub(crate) const KEY_CLUSTER_ID: &str = "cluster_id";
/// Key in `meta` of the next debt tag to hand out (absent in older stores: 1).
pub(crate) const KEY_DEBT_TAG_NEXT: &str = "debt_tag_next";
/// Key in `meta` of the next server id to hand out (kept as u64 so it can pass `ServerId::MAX`).
pub(crate) const KEY_SERVER_ID_NEXT: &str = "server_id_next";
/// First id handed out, for files and for servers alike.
pub(crate) const ID_FIRST: u64 = 1;

pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub(crate) const FILES: TableDefinition<FileId, &[u8]> = TableDefinition::new("files");
pub(crate) const PATHS: TableDefinition<&str, FileId> = TableDefinition::new("paths");
pub(crate) const SERVERS: TableDefinition<ServerId, &[u8]> = TableDefinition::new("servers");
pub(crate) const DEBTS: TableDefinition<(ServerId, FileId), &[u8]> = TableDefinition::new("debts");
pub(crate) const PENDING: TableDefinition<FileId, ()> = TableDefinition::new("pending");
pub(crate) const ORPHANS: TableDefinition<(ServerId, FileId), ()> = TableDefinition::new("orphans");

/// What the manager remembers of a storage server across restarts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ServerRecord {
    /// Address clients reach it at.
    pub addr: String,
    /// Id of its on-disk store; a new one means the store was wiped.
    pub incarnation: u64,
}

/// Why a request could not be answered as asked.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The request is refused for a reason the caller can act on.
    Refused(ManagerError),
    /// The embedded store failed.
    Store(redb::Error),
    /// A stored record could not be decoded (or a record could not be encoded).
    Codec(postcard::Error),
    /// The store was written in a format this build does not know.
    UnknownFormat(u64),
}

impl From<Failure> for ManagerError {
    fn from(failure: Failure) -> ManagerError {
        match failure {
            Failure::Refused(error) => error,
            Failure::Store(error) => ManagerError::Store(error.to_string()),
            Failure::Codec(error) => ManagerError::Store(format!("bad record: {error}")),
            Failure::UnknownFormat(found) => ManagerError::Store(format!(
                "unknown format version {found} (this build reads {FORMAT_VERSION})"
            )),
        }
    }
}

impl From<ManagerError> for Failure {
    fn from(error: ManagerError) -> Failure {
        Failure::Refused(error)
    }
}

impl From<postcard::Error> for Failure {
    fn from(error: postcard::Error) -> Failure {
        Failure::Codec(error)
    }
}

/// Every redb error type converts into `redb::Error`, and from there into a [`Failure`].
macro_rules! store_failure_from {
    ($($error:ty),*) => {$(
        impl From<$error> for Failure {
            fn from(error: $error) -> Failure {
                Failure::Store(error.into())
            }
        }
    )*};
}

store_failure_from!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// All tables, opened (and created if missing) in one write transaction.
pub(crate) struct Tables<'txn> {
    pub meta: Table<'txn, &'static str, u64>,
    pub files: Table<'txn, FileId, &'static [u8]>,
    pub paths: Table<'txn, &'static str, FileId>,
    pub servers: Table<'txn, ServerId, &'static [u8]>,
    pub debts: Table<'txn, (ServerId, FileId), &'static [u8]>,
    pub pending: Table<'txn, FileId, ()>,
    pub orphans: Table<'txn, (ServerId, FileId), ()>,
}

impl<'txn> Tables<'txn> {
    /// Opens every table in `txn`, creating those that do not exist yet.
    pub fn open(txn: &'txn WriteTransaction) -> Result<Tables<'txn>, Failure> {
        Ok(Tables {
            meta: txn.open_table(META)?,
            files: txn.open_table(FILES)?,
            paths: txn.open_table(PATHS)?,
            servers: txn.open_table(SERVERS)?,
            debts: txn.open_table(DEBTS)?,
            pending: txn.open_table(PENDING)?,
            orphans: txn.open_table(ORPHANS)?,
        })
    }
}

/// A file's metadata, if the file exists.
pub(crate) fn read_file(
    files: &impl ReadableTable<FileId, &'static [u8]>,
    file: FileId,
) -> Result<Option<FileMeta>, Failure> {
    match files.get(file)? {
        Some(record) => Ok(Some(postcard::from_bytes(record.value())?)),
        None => Ok(None),
    }
}

/// Every file whose columns include `server`, in file id order.
pub(crate) fn read_files_on(
    files: &impl ReadableTable<FileId, &'static [u8]>,
    server: ServerId,
) -> Result<Vec<FileMeta>, Failure> {
    let mut found = Vec::new();
    for entry in files.iter()? {
        let (_, record) = entry?;
        let meta: FileMeta = postcard::from_bytes(record.value())?;
        if meta.servers.contains(&server) {
            found.push(meta);
        }
    }
    Ok(found)
}

/// A server's record, if the server is known.
pub(crate) fn read_server(
    servers: &impl ReadableTable<ServerId, &'static [u8]>,
    server: ServerId,
) -> Result<Option<ServerRecord>, Failure> {
    match servers.get(server)? {
        Some(record) => Ok(Some(postcard::from_bytes(record.value())?)),
        None => Ok(None),
    }
}

/// The stripes `server` owes of `file`: a normal list, empty if it owes nothing.
pub(crate) fn read_debt(
    debts: &impl ReadableTable<(ServerId, FileId), &'static [u8]>,
    server: ServerId,
    file: FileId,
) -> Result<Vec<IndexRange>, Failure> {
    read_debt_tagged(debts, server, file).map(|(stripes, _)| stripes)
}

/// The stripes `server` owes of `file` and the debt's tag (0 for none, or a record from
/// before tags).
pub(crate) fn read_debt_tagged(
    debts: &impl ReadableTable<(ServerId, FileId), &'static [u8]>,
    server: ServerId,
    file: FileId,
) -> Result<(Vec<IndexRange>, u64), Failure> {
    match debts.get((server, file))? {
        Some(record) => decode_debt(record.value()),
        None => Ok((Vec::new(), 0)),
    }
}

/// A debt record's stripes and tag (0 for a record from before tags).
pub(crate) fn decode_debt(record: &[u8]) -> Result<(Vec<IndexRange>, u64), Failure> {
    let (ranges, rest): (Vec<IndexRange>, &[u8]) = postcard::take_from_bytes(record)?;
    let tag = if rest.is_empty() {
        0
    } else {
        postcard::from_bytes(rest)?
    };
    Ok((ranges, tag))
}

/// A debt record: the ranges, then the tag.
pub(crate) fn encode_debt(stripes: &[IndexRange], tag: u64) -> Result<Vec<u8>, Failure> {
    let mut record = postcard::to_allocvec(stripes)?;
    record.extend_from_slice(&postcard::to_allocvec(&tag)?);
    Ok(record)
}

/// Whether `server` owes stripes of any file.
pub(crate) fn has_debt(
    debts: &impl ReadableTable<(ServerId, FileId), &'static [u8]>,
    server: ServerId,
) -> Result<bool, Failure> {
    let first = debts
        .range((server, FileId::MIN)..=(server, FileId::MAX))?
        .next()
        .transpose()?;
    Ok(first.is_some())
}

/// Copies every table of the open store `db` into a new store at `path`, in one durable
/// commit: a store whose file was deleted or replaced under the manager is still whole in the
/// open database, debts included, and this copy keeps it (see `Manager::check_store`).
pub(crate) fn copy_store(db: &Database, path: &std::path::Path) -> Result<(), Failure> {
    copy_tables(&db.begin_read()?, path)
}

/// Copies every table as `from` sees it into a new store at `path`, in one durable commit
/// (also the copy a replica sends a peer that catches up: a read transaction stands still
/// while the replica applies on).
pub(crate) fn copy_tables(from: &ReadTransaction, path: &std::path::Path) -> Result<(), Failure> {
    let to_db = Database::create(path)?;
    let to = to_db.begin_write()?;
    drop(Tables::open(&to)?);
    copy_table(from, &to, META)?;
    copy_table(from, &to, FILES)?;
    copy_table(from, &to, PATHS)?;
    copy_table(from, &to, SERVERS)?;
    copy_table(from, &to, DEBTS)?;
    copy_table(from, &to, PENDING)?;
    copy_table(from, &to, ORPHANS)?;
    copy_table(from, &to, crate::keys::ACCESS_KEYS)?;
    copy_table(from, &to, crate::command::ONCE)?;
    copy_table(from, &to, crate::command::ONCE_CLIENTS)?;
    copy_table(from, &to, crate::command::ONCE_IDLE)?;
    copy_table(from, &to, crate::manager::namespace::DIRS)?;
    copy_table(from, &to, crate::manager::namespace::TIMES)?;
    copy_table(from, &to, crate::manager::namespace::DIR_TIMES)?;
    copy_table(from, &to, crate::manager::namespace::ACCESS_CHANGE)?;
    copy_table(from, &to, crate::manager::namespace::DIR_ACCESS_CHANGE)?;
    copy_table(from, &to, crate::snapshot::SNAPSHOTS)?;
    copy_table(from, &to, crate::snapshot::SNAPSHOT_FILES)?;
    copy_table(from, &to, crate::snapshot::RETAINED)?;
    copy_table(from, &to, crate::group::REPLICAS)?;
    to.commit()?;
    Ok(())
}

/// Copies one table's records, if `from` has the table.
fn copy_table<K: Key + 'static, V: Value + 'static>(
    from: &ReadTransaction,
    to: &WriteTransaction,
    table: TableDefinition<K, V>,
) -> Result<(), Failure> {
    let source = match from.open_table(table) {
        Ok(source) => source,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(error) => return Err(Failure::Store(error.into())),
    };
    let mut target = to.open_table(table)?;
    for entry in source.iter()? {
        let (key, value) = entry?;
        target.insert(key.value(), value.value())?;
    }
    Ok(())
}

/// Every record of every table as text, in key order (see `Manager::state_dump`).
pub(crate) fn dump(db: &Database) -> Result<Vec<String>, Failure> {
    let txn = db.begin_read()?;
    let mut lines = Vec::new();
    macro_rules! dump_table {
        ($name:expr, $table:expr) => {
            match txn.open_table($table) {
                Ok(table) => {
                    for entry in table.iter()? {
                        let (key, value) = entry?;
                        lines.push(format!("{} {:?} {:?}", $name, key.value(), value.value()));
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(error) => return Err(Failure::Store(error.into())),
            }
        };
    }
    dump_table!("meta", META);
    dump_table!("files", FILES);
    dump_table!("paths", PATHS);
    dump_table!("servers", SERVERS);
    dump_table!("debts", DEBTS);
    dump_table!("pending", PENDING);
    dump_table!("orphans", ORPHANS);
    dump_table!("access_keys", crate::keys::ACCESS_KEYS);
    dump_table!("once", crate::command::ONCE);
    dump_table!("once_clients", crate::command::ONCE_CLIENTS);
    dump_table!("once_idle", crate::command::ONCE_IDLE);
    dump_table!("dirs", crate::manager::namespace::DIRS);
    dump_table!("times", crate::manager::namespace::TIMES);
    dump_table!("dir_times", crate::manager::namespace::DIR_TIMES);
    dump_table!("access_change", crate::manager::namespace::ACCESS_CHANGE);
    dump_table!(
        "dir_access_change",
        crate::manager::namespace::DIR_ACCESS_CHANGE
    );
    dump_table!("snapshots", crate::snapshot::SNAPSHOTS);
    dump_table!("replicas", crate::group::REPLICAS);
    dump_table!("snapshot_files", crate::snapshot::SNAPSHOT_FILES);
    dump_table!("retained", crate::snapshot::RETAINED);
    Ok(lines)
}

#[cfg(test)]
mod debt_record_tests {
    use super::*;

    /// Debt records with a tag read back whole; records from before tags read as tag 0; and a
    /// reader of the ranges alone (an older build) reads the newer records.
    #[test]
    fn debt_records_with_and_without_a_tag() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Database::create(dir.path().join("t.redb")).expect("db");
        let ranges = vec![IndexRange::new(3, 9), IndexRange::new(20, u64::MAX)];
        let txn = db.begin_write().expect("txn");
        {
            let mut debts = txn.open_table(DEBTS).expect("table");
            let tagged = encode_debt(&ranges, u64::MAX - 1).expect("encode");
            debts.insert((1, 7), tagged.as_slice()).expect("insert");
            let untagged = postcard::to_allocvec(&ranges).expect("encode");
            debts.insert((2, 7), untagged.as_slice()).expect("insert");
        }
        txn.commit().expect("commit");
        let read = db.begin_read().expect("read");
        let debts = read.open_table(DEBTS).expect("table");
        assert_eq!(
            read_debt_tagged(&debts, 1, 7).unwrap(),
            (ranges.clone(), u64::MAX - 1)
        );
        assert_eq!(read_debt_tagged(&debts, 2, 7).unwrap(), (ranges.clone(), 0));
        assert_eq!(read_debt(&debts, 1, 7).unwrap(), ranges);
        // What an older build does with the record: decode the ranges, ignore what follows.
        let record = debts.get((1, 7)).unwrap().expect("a record");
        let old: Vec<IndexRange> = postcard::from_bytes(record.value()).unwrap();
        assert_eq!(old, ranges);
        assert_eq!(read_debt_tagged(&debts, 3, 7).unwrap(), (Vec::new(), 0));
    }
}
