//! `Store::write_cached`: the write a network thread may do itself. It writes exactly what
//! `Store::write` would, and only where nothing but the page cache is needed; everywhere
//! else it does nothing and says so (`Ok(None)`), leaving the write to `Store::write`.

use std::path::Path;

use tessera_store::{
    IntentPiece, MemDisk, OverflowRole, ParityIntent, Region, StorageError, Store,
};

const FILE: u64 = 5;

/// A store on the in-memory disk whose file `FILE` is open and whose `unsynced` mark is
/// durable: a first write made both.
fn store_written() -> (MemDisk, Store) {
    let disk = MemDisk::new();
    let store = Store::open_on(disk.shared(), Path::new("/store")).unwrap();
    store
        .write(FILE, Region::Data, 0, &[1; 4096], false)
        .unwrap();
    (disk, store)
}

#[test]
fn whole_blocks_are_written_as_a_write_writes_them_and_sync_keeps_them() {
    let (disk, store) = store_written();
    let bytes: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        store
            .write_cached(FILE, Region::Data, 4096, &bytes, true)
            .unwrap(),
        Some(())
    );
    assert_eq!(
        store
            .write_cached(FILE, Region::Redundancy, 8192, &bytes, false)
            .unwrap(),
        Some(())
    );
    assert_eq!(
        store
            .read(FILE, Region::Data, 4096, 3 * 4096, true)
            .unwrap(),
        bytes
    );
    // Owed to the next sync like any answered write: a crash after it keeps the bytes.
    store.sync().unwrap();
    drop(store);
    disk.power_loss(7);
    let store = Store::open_on(disk.shared(), Path::new("/store")).unwrap();
    assert_eq!(
        store
            .read(FILE, Region::Data, 4096, 3 * 4096, true)
            .unwrap(),
        bytes
    );
    assert_eq!(
        store
            .read(FILE, Region::Redundancy, 8192, 3 * 4096, false)
            .unwrap(),
        bytes
    );
}

/// An answered inline write holds the `unsynced` mark as a write does: a power loss
/// before the sync renews the store instead of serving what the loss left.
#[test]
fn an_inline_write_not_synced_renews_the_store_after_a_power_loss() {
    let (disk, store) = store_written();
    store.sync().unwrap();
    // The sync removed the mark: the first write after it makes it durable again.
    assert_eq!(
        store
            .write_cached(FILE, Region::Data, 0, &[2; 4096], false)
            .unwrap(),
        None
    );
    store
        .write(FILE, Region::Data, 0, &[2; 4096], false)
        .unwrap();
    assert_eq!(
        store
            .write_cached(FILE, Region::Data, 4096, &[3; 4096], false)
            .unwrap(),
        Some(())
    );
    let incarnation = store.incarnation();
    drop(store);
    disk.power_loss(3);
    let store = Store::open_on(disk.shared(), Path::new("/store")).unwrap();
    assert_ne!(store.incarnation(), incarnation);
}

#[test]
fn what_needs_more_than_the_page_cache_is_left_to_write() {
    // No durable mark yet (a fresh store): making it syncs a directory.
    let disk = MemDisk::new();
    let fresh = Store::open_on(disk.shared(), Path::new("/store")).unwrap();
    assert_eq!(
        fresh
            .write_cached(FILE, Region::Data, 0, &[1; 4096], false)
            .unwrap(),
        None
    );
    let (_disk, store) = store_written();
    let none = |store: &Store, file, region, offset, len: usize, invalidate| {
        let got = store
            .write_cached(file, region, offset, &vec![9; len], invalidate)
            .unwrap();
        assert_eq!(got, None, "file {file} {region:?} {offset}+{len}");
    };
    // Partial blocks: edge blocks are read and verified first.
    none(&store, FILE, Region::Data, 100, 4096, false);
    none(&store, FILE, Region::Data, 0, 4000, false);
    // A file not open yet: opening it reads the disk.
    none(&store, FILE + 1, Region::Data, 0, 4096, false);
    // A primary overflow entry under the bytes: trimming it syncs the data first.
    store
        .overflow_write(FILE, OverflowRole::Primary, 8192 + 10, &[4; 100])
        .unwrap();
    none(&store, FILE, Region::Data, 8192, 4096, true);
    assert_eq!(
        store
            .read(FILE, Region::Data, 8192 + 10, 100, true)
            .unwrap(),
        vec![4; 100]
    );
    // An intent record of the file: a parity write may resolve it (`write` clears it).
    let intent = ParityIntent {
        unit_offset: 0,
        span_start: 0,
        span_len: 4096,
        pieces: vec![IntentPiece {
            column: 1,
            offset_in_unit: 0,
            len: 4096,
        }],
    };
    store.record_intent(FILE, 0, &intent, &[0; 4096]).unwrap();
    none(&store, FILE, Region::Redundancy, 0, 4096, false);
    // A data write resolves none: the read-modify-write's own data write is inline, and the
    // record stays for the parity write to clear.
    let data = store.write_cached(FILE, Region::Data, 16384, &[8; 4096], false);
    assert_eq!(data.unwrap(), Some(()));
    assert!(store.intent(FILE, 0).unwrap().is_some(), "the record stays");
    // A snapshot begun: overwritten blocks are copied first.
    let (_disk, store) = store_written();
    store.snapshot_begin(&[FILE], 1).unwrap();
    none(&store, FILE, Region::Data, 0, 4096, false);
}

#[test]
fn a_bad_range_is_refused_as_a_write_refuses_it() {
    let (_disk, store) = store_written();
    let refused = store.write_cached(FILE, Region::Data, u64::MAX - 4095, &[0; 4096], false);
    assert!(
        matches!(refused, Err(StorageError::BadRequest { .. })),
        "{refused:?}"
    );
}

#[test]
fn an_overflow_entry_is_appended_as_overflow_write_appends_it() {
    let disk = MemDisk::new();
    let fresh = Store::open_on(disk.shared(), Path::new("/store")).unwrap();
    let appended = fresh.overflow_write_cached(FILE, OverflowRole::Primary, 10, &[5; 300]);
    assert_eq!(appended.unwrap(), None, "no durable mark yet");
    let (disk, store) = store_written();
    for role in [OverflowRole::Primary, OverflowRole::Mirror] {
        let appended = store.overflow_write_cached(FILE, role, 10, &[5; 300]);
        assert_eq!(appended.unwrap(), Some(()));
    }
    assert_eq!(
        store.read(FILE, Region::Data, 0, 4096, true).unwrap()[10..310],
        [5; 300]
    );
    store.sync().unwrap();
    drop(store);
    disk.power_loss(11);
    let store = Store::open_on(disk.shared(), Path::new("/store")).unwrap();
    let (entries, bytes) = store
        .overflow_list(FILE, OverflowRole::Mirror, 0, 4096)
        .unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(bytes, [5; 300]);
    assert_eq!(
        store.read(FILE, Region::Data, 0, 4096, true).unwrap()[10..310],
        [5; 300]
    );
    store.snapshot_begin(&[FILE], 1).unwrap();
    let appended = store.overflow_write_cached(FILE, OverflowRole::Primary, 10, &[6; 300]);
    assert_eq!(appended.unwrap(), None, "a snapshot begun");
}
