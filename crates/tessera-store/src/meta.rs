//! `store.toml`: the store's format version, incarnation, server id and cluster.
//!
//! The file ends with a line `checksum = "<8 hex digits>"`: the crc32c of every byte before
//! that line, written in lowercase and compared as text, so that any flipped bit (a digit's
//! case included) is found. A file that fails it is refused with an error naming it: a
//! flipped bit must never silently change the server id, incarnation or cluster.

use std::io::ErrorKind;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tessera_wire::StorageError;

use crate::disk::{read_file, write_file_synced, Disk};
use crate::io::{disk as disk_error, disk_format};
use crate::STORE_FORMAT_VERSION;

/// Name of the store's description file under the root.
pub(crate) const META_FILE: &str = "store.toml";
const META_FILE_NEW: &str = "store.toml.new";

/// What `store.toml` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoreMeta {
    /// Random id of this store, drawn when it was created.
    pub(crate) incarnation: u64,
    /// The id the manager gave this server, once registered.
    pub(crate) server_id: Option<u32>,
    /// The cluster the server joined, once registered.
    pub(crate) cluster_id: Option<u64>,
}

/// The file as written. The incarnation and cluster are hex strings because TOML integers are
/// signed.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetaFile {
    format_version: u32,
    incarnation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    server_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster: Option<String>,
}

/// Only the version, to name an old format in the error when the checksum is missing.
#[derive(Deserialize)]
struct VersionOnly {
    format_version: u32,
}

/// Start of the last line of the file.
const CHECKSUM_PREFIX: &[u8] = b"checksum = \"";

/// The bytes before the checksum line, if the file ends with a checksum line that matches
/// them exactly.
fn verified_body(bytes: &[u8]) -> Option<&[u8]> {
    let without_newline = bytes.strip_suffix(b"\n")?;
    let line_start = without_newline
        .iter()
        .rposition(|&byte| byte == b'\n')
        .map_or(0, |at| at + 1);
    let (body, line) = bytes.split_at(line_start);
    (line == checksum_line(body).as_bytes()).then_some(body)
}

/// The last line of a file whose other bytes are `body`.
fn checksum_line(body: &[u8]) -> String {
    let prefix = std::str::from_utf8(CHECKSUM_PREFIX).expect("ASCII");
    format!("{prefix}{:08x}\"\n", crc32c::crc32c(body))
}

/// Reads `store.toml`; `None` if there is none (a new or wiped store).
pub(crate) fn load(disk: &dyn Disk, root: &Path) -> Result<Option<StoreMeta>, StorageError> {
    let path = root.join(META_FILE);
    let bytes = match read_file(disk, &path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(disk_error(format_args!("read {}", path.display()), error)),
    };
    let Some(body) = verified_body(&bytes) else {
        return Err(unverified(&path, &bytes));
    };
    let text = std::str::from_utf8(body)
        .map_err(|error| disk_format(format!("parse {}: {error}", path.display())))?;
    let file: MetaFile = toml::from_str(text)
        .map_err(|error| disk_format(format!("parse {}: {error}", path.display())))?;
    if file.format_version != STORE_FORMAT_VERSION {
        return Err(disk_format(format!(
            "{} has format version {}; this build reads version {STORE_FORMAT_VERSION}",
            path.display(),
            file.format_version
        )));
    }
    let hex = |what: &str, text: &str| {
        u64::from_str_radix(text, 16).map_err(|error| {
            disk_format(format!("{}: bad {what} {text:?}: {error}", path.display()))
        })
    };
    Ok(Some(StoreMeta {
        incarnation: hex("incarnation", &file.incarnation)?,
        server_id: file.server_id,
        cluster_id: file
            .cluster
            .as_deref()
            .map(|text| hex("cluster", text))
            .transpose()?,
    }))
}

/// Whether any line starts as the checksum line does (a version 2 file, damaged).
fn has_checksum_line(bytes: &[u8]) -> bool {
    bytes
        .split(|&byte| byte == b'\n')
        .any(|line| line.starts_with(b"checksum"))
}

/// Why a `store.toml` without a matching checksum line is refused, in one line.
fn unverified(path: &Path, bytes: &[u8]) -> StorageError {
    let version = std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| toml::from_str::<VersionOnly>(text).ok())
        .map(|file| file.format_version);
    let remedy = "the server will not start on it; move the directory away and start the server \
                  on an empty one: it joins as a new store, and `tessera rebuild` restores its \
                  data from the other servers";
    match version {
        Some(version) if version < STORE_FORMAT_VERSION && !has_checksum_line(bytes) => {
            disk_format(format!(
                "{} has format version {version}, without checksums; this build reads version \
             {STORE_FORMAT_VERSION} only; {remedy}",
                path.display()
            ))
        }
        _ => disk_format(format!(
            "{} is damaged: it does not match its checksum; {remedy}",
            path.display()
        )),
    }
}

/// Replaces `store.toml` durably: a new file, synced, renamed over the old, directory synced.
pub(crate) fn save(disk: &dyn Disk, root: &Path, meta: &StoreMeta) -> Result<(), StorageError> {
    let file = MetaFile {
        format_version: STORE_FORMAT_VERSION,
        incarnation: format!("{:016x}", meta.incarnation),
        server_id: meta.server_id,
        cluster: meta.cluster_id.map(|cluster| format!("{cluster:016x}")),
    };
    let body = toml::to_string(&file)
        .map_err(|error| disk_format(format!("serialize {META_FILE}: {error}")))?;
    let mut text =
        format!("# Tessera storage server store. Written by the server; do not edit.\n{body}");
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&checksum_line(text.as_bytes()));
    let path_new = root.join(META_FILE_NEW);
    let path = root.join(META_FILE);
    write_file_synced(disk, &path_new, text.as_bytes())
        .map_err(|error| disk_error(format_args!("write {}", path_new.display()), error))?;
    disk.rename(&path_new, &path)
        .map_err(|error| disk_error(format_args!("rename to {}", path.display()), error))?;
    sync_dir(disk, root)
}

/// Makes a directory's entries durable.
pub(crate) fn sync_dir(disk: &dyn Disk, dir: &Path) -> Result<(), StorageError> {
    disk.sync_dir(dir)
        .map_err(|error| disk_error(format_args!("sync directory {}", dir.display()), error))
}
