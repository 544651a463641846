//! `tessera mount`: a POSIX file system over a Tessera cluster, through FUSE (the `fuser`
//! crate, without libfuse: it mounts with `fusermount3`).
//!
//! This crate owns the translation from the kernel's file operations to the client library:
//! inode numbers for paths ([`inodes`]), directories and renames (the manager's directory
//! tree, `tessera_wire::NamespaceRequest`), and the buffering that turns the kernel's calls
//! of at most 1 MiB into stripe-sized requests ([`cache`]): sequential writes are gathered
//! into 8 MiB runs (write-back) and reads are fetched in aligned 8 MiB blocks (read-ahead);
//! up to four runs of a file travel at once, and a sequential reader's next block is fetched
//! while it reads the current one (`runs`).
//!
//! Times: access, modification and change times are kept by the manager
//! (`NamespaceRequest::SetTimes`); the mount sets them as POSIX says (a write or truncation
//! modifies and changes, a rename or `chmod` changes, `utimensat` sets what it gives and
//! changes) and records reads with relatime's rule.
//!
//! Durability: `fsync` sends the buffered run and syncs the file on its servers, so an
//! fsync'd byte is as durable as one written with `tessera write` and `sync`. `close`
//! (`flush`) sends the buffered run too, and reports a failed write there (`EIO`); bytes
//! written but neither fsync'd nor closed are lost if the mount process dies, as with any
//! page cache. What it does not do (yet): permissions and owners (every file is the
//! mounting user's, mode 0644, directories 0755; `chmod` and `chown` change nothing), hard
//! and symbolic links, extended attributes, keeping an unlinked file's data for the handles
//! still open on it, and cache coherence between two mounts (attributes are cached for 1 s,
//! a read-ahead block while the file is open).

pub mod cache;
mod fs;
pub mod inodes;
mod runs;

pub use fs::{MountConfig, TesseraFs};

use std::path::Path;

/// Mounts `fs` at `mountpoint` and serves it until it is unmounted (`tessera umount`,
/// `fusermount3 -u`), on `threads` threads.
pub fn serve(fs: TesseraFs, mountpoint: &Path, threads: usize) -> std::io::Result<()> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("tessera".into()),
        fuser::MountOption::Subtype("tessera".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    config.n_threads = Some(threads.max(1));
    fuser::mount(fs, mountpoint, &config)
}
