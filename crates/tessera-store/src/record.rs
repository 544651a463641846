//! The file record: what a server keeps of a file's metadata, so that a lost manager store can
//! be rebuilt from the servers (`tessera manager recover`).
//!
//! Every server that holds a column of a file keeps one record of it at
//! `<root>/files/<F>/record`: the file's id, path, layout, column servers and size as the
//! client last described them to it (when the file is created, and at each sync), and the
//! cluster the server had joined. A file's record lives in its directory, so removing the file
//! removes the record too.
//!
//! Format version 1, little-endian:
//!
//! ```text
//! magic "TSFR" | version u16 | reserved u16 (0) | body_len u32 | crc32c(body) u32 | body
//! body = postcard(FileRecord { meta: FileMeta, cluster: Option<u64>, committed: bool })
//! ```
//!
//! The checksum is crc32c over the body, as the store's other metadata is checked. A record
//! is replaced whole: written to `record.new`, synced, renamed over `record`, and the directory
//! synced; a torn or flipped record fails its checksum and reads as [`RecordError::Damaged`],
//! never as wrong metadata (recovery takes the file's record from another column's server).

use std::io::ErrorKind;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tessera_wire::{FileMeta, StorageError};

use crate::disk::{read_file, Disk, FileHandle};
use crate::io::disk as disk_error;
use crate::meta::sync_dir;

/// Name of a file's record inside its directory.
pub(crate) const RECORD_FILE: &str = "record";
const RECORD_FILE_NEW: &str = "record.new";
/// First bytes of every record.
const RECORD_MAGIC: [u8; 4] = *b"TSFR";
/// Version of the record's format, written in its header.
pub const RECORD_FORMAT_VERSION: u16 = 1;
/// Bytes of the header before the body.
const HEADER_BYTES: usize = 16;
/// Largest body accepted (a path is at most 4 KiB, a layout and 256 server ids are small).
const BODY_BYTES_MAX: usize = 64 << 10;

/// A file's metadata as a server keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// The file as the manager last described it to a client that told this server.
    pub meta: FileMeta,
    /// The cluster this server had joined when it wrote the record.
    pub cluster: Option<u64>,
    /// Whether the file is known to have been committed: created whole, or a pending file of
    /// an atomic replace that took its path. A file only ever recorded uncommitted was an
    /// interrupted `put`, and recovery does not give it its path.
    pub committed: bool,
}

/// A page of a store's file records ([`crate::Store::records`]), in file id order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordPage {
    /// Files with a whole record.
    pub records: Vec<FileRecord>,
    /// Files whose record is damaged.
    pub damaged: Vec<u64>,
    /// Files stored here without a record (their id is in use all the same).
    pub unrecorded: Vec<u64>,
    /// Whether more files follow.
    pub more: bool,
}

/// Why a record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The record's bytes are not a valid record: torn, flipped, or of an unknown version.
    #[error("damaged file record: {0}")]
    Damaged(String),
    /// The disk failed.
    #[error(transparent)]
    Disk(#[from] StorageError),
}

/// The bytes of a record.
pub fn encode(record: &FileRecord) -> Vec<u8> {
    let body = postcard::to_allocvec(record).expect("a record always encodes");
    assert!(
        body.len() <= BODY_BYTES_MAX,
        "record body of {} bytes",
        body.len()
    );
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(&RECORD_MAGIC);
    out.extend_from_slice(&RECORD_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// A record from its bytes; anything but a whole, checksummed record of a known version is
/// [`RecordError::Damaged`].
pub fn decode(bytes: &[u8]) -> Result<FileRecord, RecordError> {
    let damaged = |why: String| Err(RecordError::Damaged(why));
    if bytes.len() < HEADER_BYTES {
        return damaged(format!("{} bytes, shorter than the header", bytes.len()));
    }
    if bytes[0..4] != RECORD_MAGIC {
        return damaged("bad magic".into());
    }
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let version = u16_at(4);
    if version != RECORD_FORMAT_VERSION || u16_at(6) != 0 {
        return damaged(format!("format version {version}, reserved {}", u16_at(6)));
    }
    let body = &bytes[HEADER_BYTES..];
    if u32_at(8) as usize != body.len() || body.len() > BODY_BYTES_MAX {
        return damaged(format!(
            "body of {} bytes, header says {}",
            body.len(),
            u32_at(8)
        ));
    }
    if crc32c::crc32c(body) != u32_at(12) {
        return damaged("checksum mismatch".into());
    }
    postcard::from_bytes(body).or_else(|error| damaged(format!("undecodable body: {error}")))
}

/// The record in a file's directory, if it has one.
pub(crate) fn load(disk: &dyn Disk, dir: &Path) -> Result<Option<FileRecord>, RecordError> {
    let path = dir.join(RECORD_FILE);
    match read_file(disk, &path) {
        Ok(bytes) => decode(&bytes).map(Some),
        Err(error) if error.kind() == ErrorKind::NotFound => Ok(None),
        Err(error) => Err(disk_error(format_args!("read {}", path.display()), error).into()),
    }
}

/// Replaces the record in a file's directory durably, unless it already says the same;
/// whether it wrote it (and so synced the directory: every entry made in it before the call
/// is durable).
pub(crate) fn save(disk: &dyn Disk, dir: &Path, record: &FileRecord) -> Result<bool, StorageError> {
    let Some(staged) = stage(disk, dir, record)? else {
        return Ok(false);
    };
    staged.sync_data()?;
    staged.install()?;
    sync_dir(disk, dir)?;
    Ok(true)
}

/// A record written to `record.new`, not yet durable nor in place: [`Staged::sync_data`],
/// then [`Staged::install`], then a sync of the directory make it the record, in that order
/// (a rename made durable before the bytes it names would leave a damaged record).
pub(crate) struct Staged<'a> {
    disk: &'a dyn Disk,
    dir: &'a Path,
    file: FileHandle,
}

impl Staged<'_> {
    /// Makes the new record's bytes durable (`fdatasync` of `record.new`).
    pub(crate) fn sync_data(&self) -> Result<(), StorageError> {
        let path = self.dir.join(RECORD_FILE_NEW);
        (self.file.sync_data())
            .map_err(|error| disk_error(format_args!("sync {}", path.display()), error))
    }

    /// The open `record.new`, for a caller that syncs it in a batch with other files.
    pub(crate) fn handle(&self) -> &FileHandle {
        &self.file
    }

    /// Renames `record.new` over `record`; durable at the directory's next sync. Call only
    /// after [`Staged::sync_data`].
    pub(crate) fn install(self) -> Result<(), StorageError> {
        let (path_new, path) = (self.dir.join(RECORD_FILE_NEW), self.dir.join(RECORD_FILE));
        (self.disk.rename(&path_new, &path))
            .map_err(|error| disk_error(format_args!("rename to {}", path.display()), error))
    }
}

/// Writes `record` to `record.new` in a file's directory, unless the record there already
/// says the same (`None`).
pub(crate) fn stage<'a>(
    disk: &'a dyn Disk,
    dir: &'a Path,
    record: &FileRecord,
) -> Result<Option<Staged<'a>>, StorageError> {
    if matches!(load(disk, dir), Ok(Some(ref old)) if old == record) {
        return Ok(None);
    }
    let path_new = dir.join(RECORD_FILE_NEW);
    let write = |file: &FileHandle| file.write_all_at(&encode(record), 0);
    let file = disk
        .create(&path_new)
        .and_then(|file| write(&file).map(|()| file))
        .map_err(|error| disk_error(format_args!("write {}", path_new.display()), error))?;
    Ok(Some(Staged { disk, dir, file }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_layout::{Layout, Scheme};

    fn record(path: &str, size: u64) -> FileRecord {
        FileRecord {
            meta: FileMeta {
                id: 42,
                path: path.into(),
                layout: Layout::new(Scheme::Hybrid, 65536, 4).unwrap(),
                servers: vec![3, 1, 4, 2],
                size,
            },
            cluster: Some(0xfeed_beef),
            committed: true,
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let disk = &crate::RealDisk;
        assert_eq!(load(disk, dir.path()).unwrap(), None);
        save(disk, dir.path(), &record("a/b", 12345)).unwrap();
        assert_eq!(load(disk, dir.path()).unwrap(), Some(record("a/b", 12345)));
        save(disk, dir.path(), &record("a/c", u64::MAX)).unwrap();
        assert_eq!(
            load(disk, dir.path()).unwrap(),
            Some(record("a/c", u64::MAX))
        );
        assert!(!dir.path().join(RECORD_FILE_NEW).exists());
    }

    /// A store lists its records in id order, page by page, with damaged ones named apart,
    /// and a removed file's record goes with it.
    #[test]
    fn a_store_lists_records_by_page_and_forgets_removed_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::open(dir.path()).unwrap();
        store.set_membership(0xfeed_beef, 3).unwrap();
        for id in [5, 1, 9, 7] {
            let mut meta = record("p", id).meta;
            meta.id = id;
            meta.path = format!("file-{id}");
            store.describe(&meta, id != 9).unwrap();
        }
        store
            .write(2, crate::Region::Data, 0, b"no record", false)
            .unwrap();
        let ids = |records: &[FileRecord]| records.iter().map(|r| r.meta.id).collect::<Vec<_>>();
        let page = store.records(0, 2).unwrap();
        assert_eq!(
            (ids(&page.records), page.unrecorded, page.more),
            (vec![1], vec![2], true)
        );
        assert_eq!(page.records[0].cluster, Some(0xfeed_beef));
        let page = store.records(2, 2).unwrap();
        assert_eq!(page.records[0].meta.path, "file-5");
        let record_path = dir.path().join("files/7").join(RECORD_FILE);
        let mut bytes = std::fs::read(&record_path).unwrap();
        *bytes.last_mut().unwrap() ^= 0x10;
        std::fs::write(&record_path, bytes).unwrap();
        let page = store.records(5, 2).unwrap();
        assert_eq!(
            (ids(&page.records), page.damaged, page.more),
            (vec![9], vec![7], false)
        );
        assert!(!page.records[0].committed);
        // Committed sticks: a later description that does not know keeps it.
        let mut meta = page.records[0].meta.clone();
        store.describe(&meta, true).unwrap();
        meta.size = 1234;
        store.describe(&meta, false).unwrap();
        let page = store.records(8, 1).unwrap();
        assert!(page.records[0].committed && page.records[0].meta.size == 1234);
        store.remove(9).unwrap();
        let page = store.records(0, 10).unwrap();
        assert_eq!(ids(&page.records), vec![1, 5]);
    }

    /// Every single-bit flip and every truncation of a record is caught, never read as a
    /// record that differs from the one written.
    #[test]
    fn every_bit_flip_and_truncation_is_detected() {
        let bytes = encode(&record("some/path", 999));
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                matches!(decode(&flipped), Err(RecordError::Damaged(_))),
                "bit {bit} flipped went unnoticed"
            );
        }
        for len in 0..bytes.len() {
            assert!(matches!(
                decode(&bytes[..len]),
                Err(RecordError::Damaged(_))
            ));
        }
        assert_eq!(decode(&bytes).unwrap(), record("some/path", 999));
    }
}
