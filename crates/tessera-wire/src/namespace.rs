//! The directory tree over the manager's flat namespace: explicit directories, renames,
//! directory listings and times (access, modification, change), as the POSIX mount needs
//! them.
//!
//! The manager names files by whole paths (`a/b/c`). A directory exists if it was made
//! (`MakeDir`) or if any file or made directory lies below it (a file put as `a/b/c` makes
//! `a` and `a/b` directories); the root is the empty path. A rename moves one file, or a
//! directory with everything below it, in one ordered change.

use crate::FileMeta;
use serde::{Deserialize, Serialize};

/// A request about the directory tree (carried by `ManagerRequest::Namespace`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NamespaceRequest {
    /// Make an empty directory; its parent must be a directory.
    MakeDir {
        /// Path of the new directory.
        path: String,
    },
    /// Remove an empty directory.
    RemoveDir {
        /// Path of the directory.
        path: String,
    },
    /// Rename a file or a directory (with everything below it). A file at `to` is replaced
    /// (its data freed); an empty directory at `to` is replaced by a directory.
    Rename {
        /// Old path.
        from: String,
        /// New path.
        to: String,
    },
    /// The files and directories directly below a directory (`""` is the root).
    ListDir {
        /// Path of the directory.
        path: String,
    },
    /// What a path names: a file, a directory, or nothing.
    Entry {
        /// Path asked about.
        path: String,
    },
    /// Record a file's modification time (the writer's clock: time enters the replicated
    /// state only as a value in an ordered request).
    Touch {
        /// File.
        file: crate::FileId,
        /// Nanoseconds since the Unix epoch.
        modified: u64,
    },
    /// Record a directory's modification time (the writer's clock, as for `Touch`): the
    /// mount sends it after each change of the directory's entries, and for `utimensat`.
    TouchDir {
        /// Path of the directory (`""` is the root).
        path: String,
        /// Nanoseconds since the Unix epoch.
        modified: u64,
    },
    /// Record times of a file or a directory (the writer's clock, as for `Touch`): each time
    /// given replaces the recorded one, each `None` keeps it. The mount sends it for
    /// `utimensat`, for a change of the entry itself (its `ctime`: a rename, a `chmod`) and
    /// for a read (its `atime`).
    SetTimes {
        /// The file or directory.
        of: TimesOf,
        /// The times to record.
        times: Times,
    },
}

/// What a [`NamespaceRequest::SetTimes`] is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimesOf {
    /// The file or directory at this path (`""` is the root).
    Path(String),
    /// This file, wherever it is named now.
    File(crate::FileId),
}

/// An entry's times, nanoseconds since the Unix epoch, each `None` until one is recorded.
/// `Touch` and `TouchDir` record a modification, which is also a change: they set
/// `modified` and `changed` alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Times {
    /// Last access (`atime`).
    pub accessed: Option<u64>,
    /// Last modification of the contents (`mtime`).
    pub modified: Option<u64>,
    /// Last change of the contents or of the entry itself (`ctime`).
    pub changed: Option<u64>,
}

impl Times {
    /// The times a modification at `at` records: a modification is also a change.
    pub fn modified_at(at: u64) -> Times {
        Times {
            accessed: None,
            modified: Some(at),
            changed: Some(at),
        }
    }

    /// The times a change of the entry itself (a rename, a `chmod`) at `at` records.
    pub fn changed_at(at: u64) -> Times {
        Times {
            changed: Some(at),
            ..Times::default()
        }
    }
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NamespaceEntry {
    /// A file, with the times recorded for it.
    File {
        /// The file.
        meta: FileMeta,
        /// Its times.
        times: Times,
    },
    /// A directory, with the times recorded for it.
    Dir {
        /// Its times.
        times: Times,
    },
}

/// The entries directly below a directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirListing {
    /// Names (last path component) of the directories below, sorted.
    pub dirs: Vec<String>,
    /// Files below with their modification times, sorted by path.
    pub files: Vec<(FileMeta, Option<u64>)>,
}

/// The parent directory of `path` (`""` for a top-level entry).
pub fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(parent, _)| parent)
}

/// `name` inside directory `dir` (`""` is the root).
pub fn join_path(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_and_joins_invert() {
        assert_eq!(parent_of("a"), "");
        assert_eq!(parent_of("a/b/c"), "a/b");
        assert_eq!(join_path("", "a"), "a");
        assert_eq!(join_path("a/b", "c"), "a/b/c");
        assert_eq!(join_path(parent_of("a/b/c"), "c"), "a/b/c");
    }
}
