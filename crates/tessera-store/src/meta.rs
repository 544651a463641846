//! `store.toml`: the store's format version, incarnation, server id and cluster.

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use tessera_wire::StorageError;

use crate::io::{disk, disk_format};
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

/// Reads `store.toml`; `None` if there is none (a new or wiped store).
pub(crate) fn load(root: &Path) -> Result<Option<StoreMeta>, StorageError> {
    let path = root.join(META_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(disk(format_args!("read {}", path.display()), error)),
    };
    let file: MetaFile = toml::from_str(&text)
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

/// Replaces `store.toml` durably: a new file, synced, renamed over the old, directory synced.
pub(crate) fn save(root: &Path, meta: &StoreMeta) -> Result<(), StorageError> {
    let file = MetaFile {
        format_version: STORE_FORMAT_VERSION,
        incarnation: format!("{:016x}", meta.incarnation),
        server_id: meta.server_id,
        cluster: meta.cluster_id.map(|cluster| format!("{cluster:016x}")),
    };
    let body = toml::to_string(&file)
        .map_err(|error| disk_format(format!("serialize {META_FILE}: {error}")))?;
    let text =
        format!("# Tessera storage server store. Written by the server; do not edit.\n{body}");
    let path_new = root.join(META_FILE_NEW);
    let path = root.join(META_FILE);
    let mut new = File::create(&path_new)
        .map_err(|error| disk(format_args!("create {}", path_new.display()), error))?;
    new.write_all(text.as_bytes())
        .and_then(|()| new.sync_all())
        .map_err(|error| disk(format_args!("write {}", path_new.display()), error))?;
    fs::rename(&path_new, &path)
        .map_err(|error| disk(format_args!("rename to {}", path.display()), error))?;
    sync_dir(root)
}

/// Makes a directory's entries durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(|error| disk(format_args!("sync directory {}", dir.display()), error))
}
