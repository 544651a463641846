//! The data and redundancy files: checksummed whole-block I/O (CSAR 5.2), usage, removal,
//! the store's identity, and concurrent use.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_store::{
    OverflowRole, Region, StorageError, Store, BLOCK_BYTES, FILE_BYTES_MAX, REQUEST_BYTES_MAX,
};

const FILE: u64 = 42;

fn on_disk(root: &Path, file: u64, name: &str) -> PathBuf {
    root.join("files").join(file.to_string()).join(name)
}

fn flip_byte(path: &Path, at: u64) {
    let handle = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    handle.read_exact_at(&mut byte, at).unwrap();
    byte[0] ^= 0x5a;
    handle.write_all_at(&byte, at).unwrap();
}

/// Bytes that differ at every position, so misplaced copies show.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn corrupt(region: Region, offset: u64) -> StorageError {
    StorageError::Corrupt {
        file: FILE,
        region,
        offset,
    }
}

#[test]
fn unaligned_writes_read_back_with_zeros_in_holes_and_past_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut model = vec![0u8; 40_000];
    let writes = [
        (0u64, 1usize),
        (4095, 2),
        (5000, 10_000),
        (8192, 4096),
        (12_000, 1),
        (20_001, 8191),
        (3, 4090),
    ];
    for (seed, &(offset, len)) in writes.iter().enumerate() {
        let data = pattern(len, seed as u8);
        store
            .write(FILE, Region::Data, offset, &data, false)
            .unwrap();
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
    }
    for (offset, len) in [
        (0u64, 40_000u32),
        (1, 1),
        (4094, 3),
        (8191, 4098),
        (28_000, 12_000),
    ] {
        let got = store.read(FILE, Region::Data, offset, len, false).unwrap();
        assert_eq!(
            got,
            &model[offset as usize..(offset + u64::from(len)) as usize],
            "read {offset}+{len}"
        );
    }
    // The redundancy file is separate, and never written here.
    let parity = store
        .read(FILE, Region::Redundancy, 0, 9000, false)
        .unwrap();
    assert!(parity.iter().all(|&byte| byte == 0));
    // A file never written reads as zeros too.
    assert_eq!(
        store.read(7, Region::Data, 4000, 200, true).unwrap(),
        vec![0; 200]
    );
    assert_eq!(
        store.read(FILE, Region::Data, 5, 0, false).unwrap(),
        Vec::<u8>::new()
    );
}

#[test]
fn writes_reach_disk_in_whole_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store
        .write(FILE, Region::Data, 4100, b"xyz", false)
        .unwrap();
    let data = std::fs::metadata(on_disk(dir.path(), FILE, "data")).unwrap();
    assert_eq!(data.len(), 2 * BLOCK_BYTES);
    let sidecar = std::fs::metadata(on_disk(dir.path(), FILE, "data.crc")).unwrap();
    assert_eq!(sidecar.len(), 2 * 8);
}

#[test]
fn flipped_byte_is_corrupt_at_its_block_and_never_returned() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let data = pattern(5 * BLOCK_BYTES as usize, 1);
    store.write(FILE, Region::Data, 0, &data, false).unwrap();
    store
        .write(FILE, Region::Redundancy, 0, &data, false)
        .unwrap();
    flip_byte(&on_disk(dir.path(), FILE, "data"), 3 * BLOCK_BYTES + 17);

    let whole = store.read(FILE, Region::Data, 0, data.len() as u32, false);
    assert_eq!(whole, Err(corrupt(Region::Data, 3 * BLOCK_BYTES)));
    let one_byte = store.read(FILE, Region::Data, 3 * BLOCK_BYTES + 4000, 1, false);
    assert_eq!(one_byte, Err(corrupt(Region::Data, 3 * BLOCK_BYTES)));
    let overlaid = store.read(FILE, Region::Data, 2 * BLOCK_BYTES + 1, 5000, true);
    assert_eq!(overlaid, Err(corrupt(Region::Data, 3 * BLOCK_BYTES)));
    // Blocks around it, and the redundancy file, are still fine.
    let before = store
        .read(FILE, Region::Data, 0, 3 * BLOCK_BYTES as u32, false)
        .unwrap();
    assert_eq!(before, &data[..3 * BLOCK_BYTES as usize]);
    let after = store
        .read(FILE, Region::Data, 4 * BLOCK_BYTES, 4096, false)
        .unwrap();
    assert_eq!(after, &data[4 * BLOCK_BYTES as usize..]);
    assert_eq!(
        store
            .read(FILE, Region::Redundancy, 0, data.len() as u32, false)
            .unwrap(),
        data
    );

    // A damaged checksum entry is as bad as a damaged block.
    flip_byte(&on_disk(dir.path(), FILE, "redundancy.crc"), 8 + 2);
    let parity = store.read(FILE, Region::Redundancy, 0, 10, false);
    assert_eq!(parity, Ok(data[..10].to_vec()));
    let parity = store.read(FILE, Region::Redundancy, 100, 8000, false);
    assert_eq!(parity, Err(corrupt(Region::Redundancy, BLOCK_BYTES)));

    // A whole-block rewrite heals the block without reading it.
    let fresh = pattern(BLOCK_BYTES as usize, 9);
    store
        .write(FILE, Region::Data, 3 * BLOCK_BYTES, &fresh, false)
        .unwrap();
    let healed = store
        .read(FILE, Region::Data, 3 * BLOCK_BYTES, 4096, false)
        .unwrap();
    assert_eq!(healed, fresh);
}

#[test]
fn csar_5_2_unaligned_write_into_a_corrupt_block_fails_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let data = pattern(3 * BLOCK_BYTES as usize, 2);
    store.write(FILE, Region::Data, 0, &data, false).unwrap();
    let data_path = on_disk(dir.path(), FILE, "data");
    flip_byte(&data_path, 2 * BLOCK_BYTES + 5);
    let on_disk_before = std::fs::read(&data_path).unwrap();
    let usage_before = store.usage(FILE).unwrap();

    // The tail edge block (block 2) is corrupt; the head (block 0) is fine.
    let write = store.write(FILE, Region::Data, 100, &vec![7u8; 8200], false);
    assert_eq!(write, Err(corrupt(Region::Data, 2 * BLOCK_BYTES)));
    // The head edge block is corrupt.
    let write = store.write(FILE, Region::Data, 2 * BLOCK_BYTES + 1, b"ab", false);
    assert_eq!(write, Err(corrupt(Region::Data, 2 * BLOCK_BYTES)));
    assert_eq!(std::fs::read(&data_path).unwrap(), on_disk_before);
    assert_eq!(store.usage(FILE).unwrap(), usage_before);
    let intact = store
        .read(FILE, Region::Data, 0, 2 * BLOCK_BYTES as u32, false)
        .unwrap();
    assert_eq!(intact, &data[..2 * BLOCK_BYTES as usize]);
}

#[test]
fn never_written_block_that_became_nonzero_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store
        .write(FILE, Region::Data, 0, b"first block", false)
        .unwrap();
    // Block 1 is a hole inside the file once block 2 is written.
    store
        .write(FILE, Region::Data, 2 * BLOCK_BYTES, b"third block", false)
        .unwrap();
    let hole = store
        .read(FILE, Region::Data, BLOCK_BYTES, 4096, false)
        .unwrap();
    assert!(hole.iter().all(|&byte| byte == 0));

    let data_path = on_disk(dir.path(), FILE, "data");
    flip_byte(&data_path, BLOCK_BYTES + 4095);
    let read = store.read(FILE, Region::Data, 0, 3 * BLOCK_BYTES as u32, false);
    assert_eq!(read, Err(corrupt(Region::Data, BLOCK_BYTES)));

    // Past the end of the file: bytes appear where nothing was ever written.
    let handle = OpenOptions::new().write(true).open(&data_path).unwrap();
    handle.write_all_at(b"junk", 10 * BLOCK_BYTES + 9).unwrap();
    let read = store.read(FILE, Region::Data, 10 * BLOCK_BYTES, 20, false);
    assert_eq!(read, Err(corrupt(Region::Data, 10 * BLOCK_BYTES)));
    let read = store
        .read(FILE, Region::Data, 9 * BLOCK_BYTES, 20, false)
        .unwrap();
    assert_eq!(read, vec![0; 20]);
}

#[test]
fn a_discard_reads_as_zeros_and_one_killed_between_its_cuts_is_finished_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let bytes = pattern(6 * BLOCK_BYTES as usize, 7);
    store.write(FILE, Region::Data, 0, &bytes, false).unwrap();
    store
        .write(FILE, Region::Redundancy, 0, &bytes, false)
        .unwrap();
    let unaligned = store.discard(FILE, Region::Data, BLOCK_BYTES + 1);
    assert!(matches!(unaligned, Err(StorageError::BadRequest { .. })));
    let past_the_end = store.discard(FILE, Region::Data, u64::MAX - (BLOCK_BYTES - 1));
    assert!(matches!(past_the_end, Err(StorageError::BadRequest { .. })));
    store.discard(FILE, Region::Data, 4 * BLOCK_BYTES).unwrap();
    let read = store.read(FILE, Region::Data, 0, 6 * 4096, false).unwrap();
    assert_eq!(read[..4 * 4096], bytes[..4 * 4096]);
    assert!(read[4 * 4096..].iter().all(|&byte| byte == 0));
    assert_eq!(store.usage(FILE).unwrap(), 10 * BLOCK_BYTES);
    // Growing again shows zeros, and new writes past the cut read back.
    store
        .write(FILE, Region::Data, 5 * BLOCK_BYTES, b"again", false)
        .unwrap();
    let read = store
        .read(FILE, Region::Data, 4 * BLOCK_BYTES, 4096 + 5, false)
        .unwrap();
    assert!(read[..4096].iter().all(|&byte| byte == 0));
    assert_eq!(&read[4096..], b"again");

    // A kill between the cuts of the redundancy file: its mark written, entries cut, blocks
    // not. Opening the store finishes the cut.
    drop(store);
    let cut_entries = || {
        let crc = OpenOptions::new()
            .write(true)
            .open(on_disk(dir.path(), FILE, "redundancy.crc"))
            .unwrap();
        crc.set_len(2 * 8).unwrap();
    };
    let mut mark = (2 * BLOCK_BYTES).to_le_bytes().to_vec();
    mark.extend_from_slice(&crc32c::crc32c(&mark).to_le_bytes());
    std::fs::write(on_disk(dir.path(), FILE, "discard.redundancy"), &mark).unwrap();
    cut_entries();
    let store = Store::open(dir.path()).unwrap();
    let read = store
        .read(FILE, Region::Redundancy, 0, 6 * 4096, false)
        .unwrap();
    assert_eq!(read[..2 * 4096], bytes[..2 * 4096]);
    assert!(read[2 * 4096..].iter().all(|&byte| byte == 0));
    let data_len = std::fs::metadata(on_disk(dir.path(), FILE, "redundancy"))
        .unwrap()
        .len();
    assert_eq!(data_len, 2 * BLOCK_BYTES);
    assert!(!on_disk(dir.path(), FILE, "discard.redundancy").exists());

    // The same entries lost with no discard marked (a disk that lost the sidecar's tail):
    // the blocks they covered read as corrupt, never as zeros.
    store
        .write(FILE, Region::Redundancy, 0, &bytes, false)
        .unwrap();
    store.sync().unwrap();
    drop(store);
    cut_entries();
    let store = Store::open(dir.path()).unwrap();
    let read = store.read(FILE, Region::Redundancy, 2 * BLOCK_BYTES, 4096, false);
    assert!(
        matches!(read, Err(StorageError::Corrupt { .. })),
        "{read:?}"
    );
}

#[test]
fn every_flipped_bit_of_a_checksum_entry_is_a_corrupt_block_never_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // Block 0 written with zeros, block 1 never written, block 2 written.
    store
        .write(FILE, Region::Data, 0, &[0u8; 4096], false)
        .unwrap();
    store
        .write(FILE, Region::Data, 8192, &pattern(4096, 5), false)
        .unwrap();
    drop(store);
    let crc = on_disk(dir.path(), FILE, "data.crc");
    let entries = std::fs::read(&crc).unwrap();
    assert_eq!(entries.len(), 24);
    assert_eq!(entries[8..16], [0u8; 8], "block 1 is never written");
    for bit in 0..24 * 8 {
        let mut damaged = entries.clone();
        damaged[bit / 8] ^= 1 << (bit % 8);
        std::fs::write(&crc, &damaged).unwrap();
        let store = Store::open(dir.path()).unwrap();
        let block = (bit / 64) as u64 * 4096;
        assert_eq!(
            store.read(FILE, Region::Data, block, 4096, false),
            Err(corrupt(Region::Data, block)),
            "bit {bit} of the checksum entries"
        );
    }
}

#[test]
fn out_of_bounds_requests_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let bad = |result: Result<(), StorageError>| {
        assert!(
            matches!(result, Err(StorageError::BadRequest { .. })),
            "{result:?}"
        );
    };
    bad(store
        .read(FILE, Region::Data, 0, REQUEST_BYTES_MAX + 1, false)
        .map(drop));
    bad(store
        .read(FILE, Region::Data, FILE_BYTES_MAX - 1, 2, false)
        .map(drop));
    bad(store.read(FILE, Region::Data, u64::MAX, 1, false).map(drop));
    bad(store.read(FILE, Region::Redundancy, 0, 1, true).map(drop));
    bad(store.write(FILE, Region::Data, u64::MAX - 2, b"abc", false));
    bad(store.write(FILE, Region::Redundancy, 0, b"abc", true));
    bad(store.write(
        FILE,
        Region::Data,
        0,
        &vec![0; REQUEST_BYTES_MAX as usize + 1],
        false,
    ));
    bad(store.overflow_write(FILE, OverflowRole::Primary, FILE_BYTES_MAX, b"a"));
    bad(store.overflow_invalidate(FILE, OverflowRole::Primary, 1, u64::MAX));
    bad(store
        .overflow_list(FILE, OverflowRole::Primary, FILE_BYTES_MAX, 1)
        .map(drop));
    // The largest allowed range is fine.
    let last = store
        .read(FILE, Region::Data, FILE_BYTES_MAX - 1, 1, false)
        .unwrap();
    assert_eq!(last, vec![0]);
    // Nothing was created by the rejected requests.
    assert!(!dir.path().join("files").join(FILE.to_string()).exists());
}

#[test]
fn usage_counts_written_blocks_and_live_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.usage(FILE).unwrap(), 0);
    store.write(FILE, Region::Data, 10, b"a", false).unwrap();
    assert_eq!(store.usage(FILE).unwrap(), 4096);
    // Spans blocks 0..=2: two more blocks.
    store
        .write(FILE, Region::Data, 4000, &[1; 5000], false)
        .unwrap();
    assert_eq!(store.usage(FILE).unwrap(), 3 * 4096);
    // A far block leaves a hole that costs nothing.
    store
        .write(FILE, Region::Data, 100 * BLOCK_BYTES, b"b", false)
        .unwrap();
    assert_eq!(store.usage(FILE).unwrap(), 4 * 4096);
    store
        .write(FILE, Region::Redundancy, 0, &[2; 8192], false)
        .unwrap();
    assert_eq!(store.usage(FILE).unwrap(), 6 * 4096);
    store
        .overflow_write(FILE, OverflowRole::Primary, 0, &[3; 1000])
        .unwrap();
    store
        .overflow_write(FILE, OverflowRole::Mirror, 500, &[4; 300])
        .unwrap();
    assert_eq!(store.usage(FILE).unwrap(), 6 * 4096 + 1300);
    // A newer entry shadowing part of an older one does not count twice.
    store
        .overflow_write(FILE, OverflowRole::Primary, 900, &[5; 200])
        .unwrap();
    assert_eq!(store.usage(FILE).unwrap(), 6 * 4096 + 1400);
    store
        .overflow_invalidate(FILE, OverflowRole::Primary, 0, 950)
        .unwrap();
    assert_eq!(store.usage(FILE).unwrap(), 6 * 4096 + 150 + 300);
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.usage(FILE).unwrap(), 6 * 4096 + 150 + 300);
    assert_eq!(store.usage(FILE + 1).unwrap(), 0);
}

#[test]
fn remove_deletes_everything_and_unknown_files_are_fine() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.remove(FILE).unwrap();
    store.write(FILE, Region::Data, 0, b"data", false).unwrap();
    store
        .write(FILE, Region::Redundancy, 0, b"parity", false)
        .unwrap();
    store
        .overflow_write(FILE, OverflowRole::Primary, 0, b"DA")
        .unwrap();
    store
        .write(FILE + 1, Region::Data, 0, b"other", false)
        .unwrap();
    store.sync().unwrap();

    store.remove(FILE).unwrap();
    assert!(!dir.path().join("files").join(FILE.to_string()).exists());
    assert_eq!(store.usage(FILE).unwrap(), 0);
    assert_eq!(
        store.read(FILE, Region::Data, 0, 4, true).unwrap(),
        vec![0; 4]
    );
    let (extents, _) = store
        .overflow_list(FILE, OverflowRole::Primary, 0, 10)
        .unwrap();
    assert!(extents.is_empty());
    store.sync().unwrap();
    assert_eq!(
        store.read(FILE + 1, Region::Data, 0, 5, false).unwrap(),
        b"other"
    );

    // The file can be written again from scratch.
    store.write(FILE, Region::Data, 2, b"new", false).unwrap();
    assert_eq!(
        store.read(FILE, Region::Data, 0, 6, true).unwrap(),
        b"\0\0new\0"
    );
    assert_eq!(store.usage(FILE).unwrap(), 4096);
    store.remove(FILE).unwrap();
    store.remove(FILE).unwrap();
}

/// A file the manager removed (`bury`) is deleted, and a late write that would make it
/// again is refused with `Removed` and leaves nothing on disk, also after a restart and with
/// one tombstone copy damaged; a client's `remove` buries nothing. Without tombstones the
/// late write made the file again, bytes no file in the namespace owned.
#[test]
fn a_late_write_to_a_buried_file_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let removed = |file| StorageError::Removed { file };
    let absent = |file: u64| !dir.path().join("files").join(file.to_string()).exists();
    {
        let store = Store::open(dir.path()).unwrap();
        for file in [FILE, FILE + 1, FILE + 3] {
            store
                .write(file, Region::Data, 0, b"pending", false)
                .unwrap();
        }
        store
            .write(FILE + 2, Region::Data, 0, b"live", false)
            .unwrap();
        assert_eq!(store.bury(&[FILE, FILE + 1, FILE + 3]).unwrap().len(), 3);
        store.sync().unwrap();
        assert_eq!(store.tombstone_ranges(), 2);
        for file in [FILE, FILE + 1, FILE + 3] {
            assert!(absent(file));
            assert_eq!(
                store.write(file, Region::Data, 0, b"late", false),
                Err(removed(file))
            );
            assert_eq!(
                store.overflow_write(file, OverflowRole::Primary, 0, b"late"),
                Err(removed(file))
            );
            assert_eq!(
                store.write(file, Region::Redundancy, 0, b"late", false),
                Err(removed(file))
            );
            assert!(absent(file), "a late write made file {file} again");
        }
        // The live file in between is untouched, and writes on.
        store
            .write(FILE + 2, Region::Data, 4, b"more", false)
            .unwrap();
        // A client's remove deletes bytes, but only the manager's word buries.
        store.remove(FILE + 2).unwrap();
        store
            .write(FILE + 2, Region::Data, 0, b"again", false)
            .unwrap();
    }
    // Across a restart.
    {
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.write(FILE + 1, Region::Data, 0, b"late", false),
            Err(removed(FILE + 1))
        );
        assert!(absent(FILE + 1));
        store.bury(&[FILE + 2]).unwrap();
        assert_eq!(store.tombstone_ranges(), 1);
    }
    // A flipped bit in either copy is found, the other copy serves, and both are rewritten.
    for copy in ["tombstones.0", "tombstones.1"] {
        flip_byte(&dir.path().join(copy), 21);
        let store = Store::open(dir.path()).unwrap();
        for file in FILE..=FILE + 3 {
            assert!(store.is_buried(file), "file {file} after a flip in {copy}");
            assert_eq!(
                store.write(file, Region::Data, 0, b"late", false),
                Err(removed(file))
            );
        }
        drop(store);
        let copies: Vec<Vec<u8>> = ["tombstones.0", "tombstones.1"]
            .iter()
            .map(|name| std::fs::read(dir.path().join(name)).unwrap())
            .collect();
        assert_eq!(copies[0], copies[1], "the damaged copy was not repaired");
    }
    // Both copies damaged: the store opens, says so, and has lost the fence (not a live byte).
    flip_byte(&dir.path().join("tombstones.0"), 21);
    flip_byte(&dir.path().join("tombstones.1"), 30);
    let store = Store::open(dir.path()).unwrap();
    assert!(!store.is_buried(FILE));
}

#[test]
fn incarnation_and_membership_persist_and_a_wiped_store_is_new() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = Store::open(&root).unwrap();
    let incarnation = store.incarnation();
    assert_ne!(incarnation, 0, "0 names no store");
    assert_eq!((store.server_id(), store.cluster_id()), (None, None));
    let cluster = 0xfeed_0000_0000_beef;
    store.set_membership(cluster, 17).unwrap();
    assert_eq!(
        (store.server_id(), store.cluster_id()),
        (Some(17), Some(cluster))
    );
    store.write(FILE, Region::Data, 0, b"kept", false).unwrap();
    drop(store);

    let store = Store::open(&root).unwrap();
    assert_eq!(store.incarnation(), incarnation);
    assert_eq!(
        (store.server_id(), store.cluster_id()),
        (Some(17), Some(cluster))
    );
    assert_eq!(
        store.read(FILE, Region::Data, 0, 4, false).unwrap(),
        b"kept"
    );
    drop(store);

    std::fs::remove_dir_all(&root).unwrap();
    let store = Store::open(&root).unwrap();
    assert_ne!(store.incarnation(), incarnation);
    assert_eq!((store.server_id(), store.cluster_id()), (None, None));
    drop(store);

    // Losing store.toml alone is not a wipe: a store that holds files without it is refused
    // with one line naming the file (starting it afresh would delete what it holds), and
    // what it holds is still there once the file is back.
    let store = Store::open(&root).unwrap();
    let incarnation = store.incarnation();
    store.write(FILE, Region::Data, 0, b"still", false).unwrap();
    drop(store);
    let meta = std::fs::read(root.join("store.toml")).unwrap();
    std::fs::remove_file(root.join("store.toml")).unwrap();
    let refused = Store::open(&root).expect_err("refused").to_string();
    assert!(refused.contains("store.toml is missing"), "{refused}");
    assert!(!refused.contains('\n'), "{refused}");
    std::fs::write(root.join("store.toml"), meta).unwrap();
    let store = Store::open(&root).unwrap();
    assert_eq!(store.incarnation(), incarnation);
    assert_eq!(
        store.read(FILE, Region::Data, 0, 5, false).unwrap(),
        b"still"
    );
}

#[test]
fn a_store_directory_opens_once_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert!(matches!(
        Store::open(dir.path()),
        Err(StorageError::Disk { .. })
    ));
    drop(store);
    Store::open(dir.path()).unwrap();
}

#[test]
fn unknown_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store_incarnation = Store::open(dir.path()).unwrap().incarnation();
    let meta = dir.path().join("store.toml");
    let text = std::fs::read_to_string(&meta).unwrap();
    assert!(text.contains("format_version = 2"), "{text}");
    let incarnation = format!("incarnation = \"{:016x}\"", store_incarnation);
    assert!(text.contains(&incarnation), "{text}");
    // A version this build does not know, with a checksum that matches it.
    let body = text[..text.rfind("checksum = ").unwrap()].replace("= 2", "= 99");
    let crc = crc32c::crc32c(body.as_bytes());
    std::fs::write(&meta, format!("{body}checksum = \"{crc:08x}\"\n")).unwrap();
    let error = Store::open(dir.path()).unwrap_err();
    assert!(
        matches!(&error, StorageError::Disk { detail } if detail.contains("version 99")),
        "{error:?}"
    );
    // A version 1 store, as the build before checksums wrote it: refused, saying what to do.
    let old = format!(
        "# Tessera storage server store. Written by the server; do not edit.\n\
         format_version = 1\n{incarnation}\n"
    );
    std::fs::write(&meta, old).unwrap();
    let error = Store::open(dir.path()).unwrap_err().to_string();
    for words in ["store.toml", "format version 1", "rebuild"] {
        assert!(error.contains(words), "{error}");
    }
}

#[test]
fn a_damaged_store_toml_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.set_membership(0xabcd, 3).unwrap();
    drop(store);
    let meta = dir.path().join("store.toml");
    let text = std::fs::read(&meta).unwrap();
    // A hex digit's case is one bit: "a" and "A" parse alike, so the check compares text.
    let at = text.iter().rposition(|&byte| byte == b'a').unwrap();
    for (at, bit) in [(at, 0x20), (text.len() - 1, 0x01), (0, 0x01)] {
        let mut damaged = text.clone();
        damaged[at] ^= bit;
        std::fs::write(&meta, &damaged).unwrap();
        let error = Store::open(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains("store.toml") && error.contains("checksum"),
            "flip at {at}: {error}"
        );
    }
    std::fs::write(&meta, &text).unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(
        (store.server_id(), store.cluster_id()),
        (Some(3), Some(0xabcd))
    );
}

#[test]
fn sync_succeeds_after_writes_and_removal_and_with_nothing_owed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.sync().unwrap();
    for file in 0..5 {
        store.write(file, Region::Data, 0, b"x", false).unwrap();
        store
            .overflow_write(file, OverflowRole::Mirror, 0, b"y")
            .unwrap();
    }
    store.remove(3).unwrap();
    store.sync().unwrap();
    store.sync().unwrap();
}

#[test]
fn many_files_beyond_the_handle_cache_keep_their_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let files = tessera_store::OPEN_FILES_MAX as u64 * 3;
    for file in 0..files {
        store
            .write(file, Region::Data, file, &[file as u8; 3], false)
            .unwrap();
        store
            .overflow_write(file, OverflowRole::Primary, file + 1, b"O")
            .unwrap();
    }
    store.sync().unwrap();
    for file in 0..files {
        let got = store.read(file, Region::Data, file, 3, true).unwrap();
        assert_eq!(got, [file as u8, b'O', file as u8]);
        assert_eq!(store.usage(file).unwrap(), 4096 + 1);
    }
}

#[test]
fn threads_writing_disjoint_ranges_of_one_file_read_back_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let threads = 8u64;
    // Unaligned, so neighbours share edge blocks and depend on the file lock.
    let span = 3 * BLOCK_BYTES + 123;
    let rounds = 20u8;
    let handles: Vec<_> = (0..threads)
        .map(|thread| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let offset = thread * span;
                for round in 0..rounds {
                    let data = pattern(
                        span as usize,
                        (thread as u8).wrapping_mul(50).wrapping_add(round),
                    );
                    store
                        .write(FILE, Region::Data, offset, &data, false)
                        .unwrap();
                    let got = store.read(FILE, Region::Data, offset, span as u32, false);
                    assert_eq!(got.unwrap(), data, "thread {thread} round {round}");
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let whole = store
        .read(FILE, Region::Data, 0, (threads * span) as u32, false)
        .unwrap();
    for thread in 0..threads {
        let start = (thread * span) as usize;
        let expected = pattern(
            span as usize,
            (thread as u8).wrapping_mul(50).wrapping_add(rounds - 1),
        );
        assert_eq!(&whole[start..start + span as usize], expected.as_slice());
    }
    assert_eq!(
        store.usage(FILE).unwrap(),
        (threads * span).div_ceil(BLOCK_BYTES) * BLOCK_BYTES
    );
}

#[test]
fn store_and_parity_locks_are_shareable_across_threads() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<Store>();
    shareable::<tessera_store::ParityLocks>();
}

/// Drops a file's clean pages from the page cache, so that the next read of it needs the disk.
fn evict(path: &Path) {
    use std::os::fd::AsRawFd;
    let handle = std::fs::File::open(path).unwrap();
    handle.sync_all().unwrap();
    // SAFETY: an advisory call on a descriptor we hold open.
    let done = unsafe { libc::posix_fadvise(handle.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(done, 0, "posix_fadvise");
}

/// A cached read answers exactly what a read would (bytes, zeros, corruption), but only from the
/// page cache: what would need the disk (evicted pages, a file not loaded, overflow entries under
/// the range) is `None`, and a read that may wait then fetches it.
#[test]
fn cached_reads_answer_from_the_page_cache_only() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = 8 * BLOCK_BYTES as usize;
    let data = pattern(blocks, 3);
    let overflow_at = 6 * BLOCK_BYTES;
    {
        let store = Store::open(dir.path()).unwrap();
        store.write(FILE, Region::Data, 0, &data, false).unwrap();
        store
            .overflow_write(FILE, OverflowRole::Primary, overflow_at, &[7u8; 100])
            .unwrap();
        store.sync().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let head = 4 * BLOCK_BYTES as u32;
    assert_eq!(
        store.read_cached(FILE, Region::Data, 0, head, false),
        Ok(None),
        "a file not loaded yet needs the disk"
    );
    assert_eq!(
        store.read(FILE, Region::Data, 0, 10, false),
        Ok(data[..10].to_vec())
    );

    evict(&on_disk(dir.path(), FILE, "data"));
    assert_eq!(
        store.read_cached(FILE, Region::Data, 0, head, false),
        Ok(None),
        "evicted blocks need the disk"
    );
    let waited = store.read(FILE, Region::Data, 0, head, false).unwrap();
    assert_eq!(waited, &data[..head as usize]);
    assert_eq!(
        store.read_cached(FILE, Region::Data, 0, head, false),
        Ok(Some(waited)),
        "the read that waited brought them into the page cache"
    );
    assert_eq!(
        store.read_cached(FILE, Region::Data, 100, 5000, true),
        Ok(Some(data[100..5100].to_vec())),
        "unaligned, with no overflow entry under it"
    );
    assert_eq!(
        store.read_cached(FILE, Region::Data, overflow_at, 4096, true),
        Ok(None),
        "overflow entries are read from their log"
    );
    let never_stored = FILE + 1;
    assert_eq!(
        store.read_cached(never_stored, Region::Data, 0, 10, false),
        Ok(None),
        "whether a file exists is looked up on disk"
    );
    assert_eq!(
        store.read(never_stored, Region::Data, 0, 10, false),
        Ok(vec![0; 10])
    );
    assert_eq!(
        store.read_cached(never_stored, Region::Data, 0, 10, false),
        Ok(Some(vec![0; 10])),
        "once looked up, a file this server never stored reads as zeros, as with read"
    );

    flip_byte(&on_disk(dir.path(), FILE, "data"), BLOCK_BYTES + 5);
    assert_eq!(
        store.read_cached(FILE, Region::Data, 0, head, false),
        Err(corrupt(Region::Data, BLOCK_BYTES))
    );
    assert_eq!(
        store.read_cached(FILE, Region::Redundancy, 0, 10, true),
        store.read(FILE, Region::Redundancy, 0, 10, true).map(Some),
        "a bad request is refused alike"
    );
}

/// `(start, end)` pairs of an `allocated` answer.
fn allocated(store: &Store, region: Region, offset: u64, len: u64) -> Vec<(u64, u64)> {
    store
        .allocated(FILE, region, offset, len)
        .unwrap()
        .into_iter()
        .map(|range| (range.start, range.end))
        .collect()
}

#[test]
fn allocated_lists_written_extents_and_skips_holes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // A file never written holds nothing.
    assert!(allocated(&store, Region::Data, 0, FILE_BYTES_MAX).is_empty());
    let last = FILE_BYTES_MAX - BLOCK_BYTES;
    store
        .write(FILE, Region::Data, 0, &pattern(8192, 1), false)
        .unwrap();
    store
        .write(FILE, Region::Data, last, &pattern(4096, 2), false)
        .unwrap();
    // Both ends of a 1 TiB sparse file, and nothing between. Each end is as wide as the
    // blocks one page of checksum entries covers (512 entries of 8 bytes: 2 MiB), so that a
    // damaged entry of a block that is a hole is visited too.
    let page = 512 * BLOCK_BYTES;
    let both = allocated(&store, Region::Data, 0, FILE_BYTES_MAX);
    assert_eq!(
        both,
        vec![(0, page), (FILE_BYTES_MAX - page, FILE_BYTES_MAX)]
    );
    // Clipped to the range asked.
    assert_eq!(
        allocated(&store, Region::Data, 4096, 8192),
        vec![(4096, 12288)]
    );
    assert!(allocated(&store, Region::Data, page, FILE_BYTES_MAX - 2 * page).is_empty());
    // The redundancy file is its own.
    assert!(allocated(&store, Region::Redundancy, 0, FILE_BYTES_MAX).is_empty());
    // Overflow entries of either role count for the data file, under the offsets they cover.
    let middle = 1 << 30;
    store
        .overflow_write(FILE, OverflowRole::Mirror, middle + 100, b"mirror")
        .unwrap();
    assert_eq!(
        allocated(&store, Region::Data, 0, FILE_BYTES_MAX),
        vec![
            (0, page),
            (middle + 100, middle + 106),
            (FILE_BYTES_MAX - page, FILE_BYTES_MAX)
        ]
    );
    // Past the maximum file size is a bad request, not an overflow.
    for (offset, len) in [(0, FILE_BYTES_MAX + 1), (u64::MAX, 1), (1, u64::MAX)] {
        let refused = store
            .allocated(FILE, Region::Data, offset, len)
            .unwrap_err();
        assert!(
            matches!(refused, StorageError::BadRequest { .. }),
            "{refused:?}"
        );
    }
    store.remove(FILE).unwrap();
    assert!(allocated(&store, Region::Data, 0, FILE_BYTES_MAX).is_empty());
}

#[test]
fn allocated_includes_overflow_ranges_a_damaged_log_record_may_have_changed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store
            .overflow_write(FILE, OverflowRole::Primary, 4096, b"first")
            .unwrap();
        store
            .overflow_write(FILE, OverflowRole::Mirror, 1 << 30, b"second")
            .unwrap();
        store.sync().unwrap();
    }
    // A bit of the second record (after the 12-byte header and the first 36-byte record).
    flip_byte(&on_disk(dir.path(), FILE, "overflow.log"), 12 + 36 + 9);
    let store = Store::open(dir.path()).unwrap();
    // What the record said is unknown, so every range reads corrupt until rewritten: a scrub
    // must visit all of them.
    assert_eq!(
        allocated(&store, Region::Data, 0, FILE_BYTES_MAX),
        vec![(0, FILE_BYTES_MAX)]
    );
    assert!(allocated(&store, Region::Redundancy, 0, FILE_BYTES_MAX).is_empty());
}

#[test]
fn disk_usage_counts_allocated_bytes_not_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let empty = store.disk_usage().unwrap();
    assert!(
        empty.total > 0 && empty.available <= empty.total,
        "{empty:?}"
    );
    store
        .write(FILE, Region::Data, 0, &pattern(1 << 20, 1), false)
        .unwrap();
    // A byte near 1 TiB in: the file is about 1 TiB long, its allocation one block.
    store
        .write(FILE, Region::Data, FILE_BYTES_MAX - 1, b"x", false)
        .unwrap();
    store.sync().unwrap();
    let used = store.disk_usage().unwrap();
    let grown = used.stored - empty.stored;
    // The MiB of data, its checksums and the far block; never the hole.
    assert!((1 << 20..4 << 20).contains(&grown), "grew by {grown}");
    store.remove(FILE).unwrap();
    let removed = store.disk_usage().unwrap();
    assert!(removed.stored < empty.stored + (64 << 10), "{removed:?}");
}

#[test]
fn disk_usage_of_an_in_memory_disk() {
    let disk = std::sync::Arc::new(tessera_store::MemDisk::new());
    let store = Store::open_on(disk, Path::new("/s")).unwrap();
    let before = store.disk_usage().unwrap();
    assert_eq!(before.total, tessera_store::MEM_DISK_BYTES);
    store
        .write(FILE, Region::Data, 0, &[9; 8192], false)
        .unwrap();
    let after = store.disk_usage().unwrap();
    assert!(after.stored >= before.stored + 8192, "{before:?} {after:?}");
    assert_eq!(after.total - after.available, after.stored);
}
