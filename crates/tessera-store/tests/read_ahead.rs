//! Read-ahead: a sequential read that waits for the disk asks the kernel for the next bytes
//! and their checksum entries; that never hands out stale bytes or unchecked blocks.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use tessera_store::{MemDisk, Region, StorageError, Store, BLOCK_BYTES};

const FILE: u64 = 7;
const MIB: u64 = 1 << 20;
/// Read-ahead asked for per read (the store's `READ_AHEAD_BYTES`).
const AHEAD: u64 = 8 * MIB;
/// Bytes of one checksum entry.
const ENTRY: u64 = 8;

fn on_disk(root: &Path, name: &str) -> PathBuf {
    root.join("files").join(FILE.to_string()).join(name)
}

/// Bytes that differ at every position, so misplaced copies show.
fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed) ^ (index >> 12) as u8)
        .collect()
}

#[test]
fn a_sequential_read_asks_for_what_follows_with_its_checksums_and_a_jump_does_not() {
    let disk = MemDisk::new();
    let root = Path::new("/store");
    let store = Store::open_on(disk.shared(), root).unwrap();
    let data = pattern(24 * MIB, 3);
    for (index, piece) in data.chunks(8 * MIB as usize).enumerate() {
        let at = index as u64 * 8 * MIB;
        store.write(FILE, Region::Data, at, piece, false).unwrap();
    }
    let (blocks, entries) = (on_disk(root, "data"), on_disk(root, "data.crc"));
    assert_eq!(disk.advised(&blocks), vec![], "writes give no read-ahead");

    let read = |offset: u64, len: u64| {
        store
            .read(FILE, Region::Data, offset, len as u32, false)
            .unwrap()
    };
    assert_eq!(read(0, MIB), &data[..MIB as usize]);
    assert_eq!(read(MIB, MIB), &data[MIB as usize..2 * MIB as usize]);
    let sequential = vec![(MIB, AHEAD), (2 * MIB, AHEAD)];
    assert_eq!(disk.advised(&blocks), sequential);
    let entry = |offset: u64| offset / BLOCK_BYTES * ENTRY;
    let entries_ahead = entry(AHEAD);
    assert_eq!(
        disk.advised(&entries),
        vec![(entry(MIB), entries_ahead), (entry(2 * MIB), entries_ahead)]
    );

    // A read far from where the last one ended (a random reader) asks for nothing; one
    // that follows it again does.
    assert_eq!(
        read(20 * MIB, 64 << 10),
        &data[20 * MIB as usize..][..64 << 10]
    );
    assert_eq!(disk.advised(&blocks), sequential);
    read(20 * MIB + (64 << 10), 64 << 10);
    assert_eq!(
        disk.advised(&blocks).last(),
        Some(&(20 * MIB + (128 << 10), AHEAD))
    );
}

/// Writes and syncs the store's files, then has the kernel drop their cached pages, so the
/// next read comes from the disk (clean pages go without root).
fn drop_cached(root: &Path) {
    for name in ["data", "data.crc"] {
        let file = OpenOptions::new()
            .read(true)
            .open(on_disk(root, name))
            .unwrap();
        file.sync_all().unwrap();
        // SAFETY: posix_fadvise only reads the descriptor number, which `file` keeps open.
        let result =
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(result, 0);
    }
}

/// A store on real files (in a temporary directory, kept by the caller) holding 6 MiB of
/// `pattern(_, seed)` in [`FILE`]'s data region, and those bytes.
fn store_on_real_files_with(seed: u8) -> (tempfile::TempDir, Store, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let bytes = pattern(6 * MIB, seed);
    store.write(FILE, Region::Data, 0, &bytes, false).unwrap();
    (dir, store, bytes)
}

#[test]
fn bytes_read_ahead_and_then_rewritten_read_as_the_new_bytes() {
    let (dir, store, old) = store_on_real_files_with(1);
    drop_cached(dir.path());
    let first = store
        .read(FILE, Region::Data, 0, MIB as u32, false)
        .unwrap();
    assert_eq!(first, &old[..MIB as usize]);

    // Rewrite part of what was read ahead (unaligned, so an edge block is merged too).
    let new = pattern(MIB + 100, 9);
    let at = 2 * MIB - 50;
    store.write(FILE, Region::Data, at, &new, false).unwrap();
    let mut want = old.clone();
    want[at as usize..][..new.len()].copy_from_slice(&new);
    for offset in (MIB..6 * MIB).step_by(MIB as usize) {
        let span = offset as usize..(offset + MIB) as usize;
        let read = store.read(FILE, Region::Data, offset, MIB as u32, false);
        assert_eq!(read.unwrap(), &want[span.clone()], "read at {offset}");
        let cached = store.read_cached(FILE, Region::Data, offset, MIB as u32, false);
        if let Some(bytes) = cached.unwrap() {
            assert_eq!(bytes, &want[span], "cached read at {offset}");
        }
    }
}

#[test]
fn a_block_damaged_on_disk_within_the_read_ahead_is_still_caught() {
    let (dir, store, data) = store_on_real_files_with(5);
    let damaged = 3 * MIB + 5 * BLOCK_BYTES;
    let handle = OpenOptions::new()
        .read(true)
        .write(true)
        .open(on_disk(dir.path(), "data"))
        .unwrap();
    handle
        .write_all_at(&[!data[damaged as usize + 17]], damaged + 17)
        .unwrap();
    drop_cached(dir.path());

    let first = store.read(FILE, Region::Data, 0, MIB as u32, false);
    assert_eq!(first.unwrap(), &data[..MIB as usize]);
    let corrupt = StorageError::Corrupt {
        file: FILE,
        region: Region::Data,
        offset: damaged,
    };
    for _ in 0..2 {
        // Whether or not the read-ahead has reached the page cache yet.
        let cached = store.read_cached(FILE, Region::Data, 3 * MIB, MIB as u32, false);
        assert!(
            matches!(cached, Ok(None)) || cached == Err(corrupt.clone()),
            "{cached:?}"
        );
        let read = store.read(FILE, Region::Data, 3 * MIB, MIB as u32, false);
        assert_eq!(read, Err(corrupt.clone()));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
