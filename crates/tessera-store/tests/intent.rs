//! Intent records of read-modify-writes: written before the data is (durable with the
//! store's next sync, or the store starts over after a power loss), kept across a restart,
//! refused twice, cleared by the holder's parity write or by parity written over their
//! whole span, and dropped when torn.

use std::path::Path;

use tessera_store::{IntentPiece, ParityIntent, Region, StorageError, Store};

const FILE: u64 = 9;
const STRIPE: u64 = 3;
const UNIT: u64 = 64 << 10;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Two pieces inside bytes 4096..12288 of the parity unit of stripe 3 (at `UNIT` in the
/// redundancy file).
fn intent() -> ParityIntent {
    ParityIntent {
        unit_offset: UNIT,
        span_start: 4096,
        span_len: 8192,
        pieces: vec![
            IntentPiece {
                column: 1,
                offset_in_unit: 4096,
                len: 100,
            },
            IntentPiece {
                column: 2,
                offset_in_unit: 5000,
                len: 7288,
            },
        ],
    }
}

/// A store with a parity unit written, and a record taken over it.
fn recorded(root: &Path) -> (Store, Vec<u8>, Vec<u8>) {
    let store = Store::open(root).unwrap();
    let parity = pattern(UNIT as usize, 7);
    store
        .write(FILE, Region::Redundancy, UNIT, &parity, false)
        .unwrap();
    let old_data = pattern(7388, 40);
    store
        .record_intent(FILE, STRIPE, &intent(), &old_data)
        .unwrap();
    (store, parity, old_data)
}

#[test]
fn a_record_holds_the_spans_old_parity_and_the_old_data_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (store, parity, old_data) = recorded(dir.path());
    let expected = [&parity[4096..12288], &old_data[..]].concat();
    assert_eq!(
        store.intent(FILE, STRIPE).unwrap(),
        Some((intent(), expected.clone()))
    );
    assert_eq!(store.intent(FILE, STRIPE + 1).unwrap(), None);
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(
        store.intent(FILE, STRIPE).unwrap(),
        Some((intent(), expected))
    );
}

#[test]
fn a_second_record_for_a_stripe_is_refused_until_the_first_is_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _, old_data) = recorded(dir.path());
    let again = store.record_intent(FILE, STRIPE, &intent(), &old_data);
    assert!(
        matches!(again, Err(StorageError::BadRequest { .. })),
        "{again:?}"
    );
    store.clear_intent(FILE, STRIPE).unwrap();
    assert_eq!(store.intent(FILE, STRIPE).unwrap(), None);
    store
        .record_intent(FILE, STRIPE, &intent(), &old_data)
        .unwrap();
}

#[test]
fn malformed_records_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut outside = intent();
    outside.pieces[1].len += 1;
    let short = store.record_intent(FILE, STRIPE, &intent(), &[0u8; 10]);
    let past = store.record_intent(FILE, STRIPE, &outside, &[0u8; 7389]);
    for refused in [short, past] {
        assert!(
            matches!(refused, Err(StorageError::BadRequest { .. })),
            "{refused:?}"
        );
    }
    assert_eq!(store.intent(FILE, STRIPE).unwrap(), None);
}

#[test]
fn parity_written_over_the_whole_span_clears_the_record_and_a_part_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _, _) = recorded(dir.path());
    // A part of the span: the record still describes the rest.
    store
        .write(FILE, Region::Redundancy, UNIT + 4096, &[1u8; 4096], false)
        .unwrap();
    // Data writes never touch it.
    store
        .write(FILE, Region::Data, UNIT, &[1u8; 65536], false)
        .unwrap();
    assert!(store.intent(FILE, STRIPE).unwrap().is_some());
    // A whole unit of parity (full-stripe write, rebuilt unit) covers it.
    store
        .write(FILE, Region::Redundancy, UNIT, &[2u8; 65536], false)
        .unwrap();
    assert_eq!(store.intent(FILE, STRIPE).unwrap(), None);
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.intent(FILE, STRIPE).unwrap(), None);
}

#[test]
fn a_torn_record_is_dropped_at_open() {
    let recorded_dir = tempfile::tempdir().unwrap();
    let (store, _, _) = recorded(recorded_dir.path());
    drop(store);
    let name = format!("{FILE}.{STRIPE}");
    let bytes = std::fs::read(recorded_dir.path().join("intents").join(&name)).unwrap();
    // Torn: the server died while writing it, under its staging name (so it never answered,
    // and no data followed; nor is it on the roster).
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    let staging = dir.path().join("intents").join(format!("{name}.new"));
    std::fs::write(&staging, &bytes[..bytes.len() - 1]).unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.intent(FILE, STRIPE).unwrap(), None);
    assert!(!staging.exists());
    assert_eq!(store.stale_records(), 0);
}

/// A record under its own name was answered: its writer may have died between its data and
/// its parity. Cut short or flipped, it is not dropped (parity would then be trusted), but
/// kept as an orphaned stale-parity record of its stripe: nothing reconstructs from that
/// parity until it is recomputed from the data.
#[test]
fn a_damaged_record_leaves_its_stripe_stale() {
    for damage in ["cut", "flip"] {
        let dir = tempfile::tempdir().unwrap();
        let (store, _, _) = recorded(dir.path());
        drop(store);
        let path = dir.path().join("intents").join(format!("{FILE}.{STRIPE}"));
        let mut bytes = std::fs::read(&path).unwrap();
        match damage {
            "cut" => bytes.truncate(bytes.len() - 1),
            _ => bytes[100] ^= 4,
        }
        std::fs::write(&path, &bytes).unwrap();
        let store = Store::open(dir.path()).unwrap();
        let now = tokio::time::Instant::now();
        assert_eq!(store.intent(FILE, STRIPE).unwrap(), None, "{damage}");
        assert!(!path.exists(), "{damage}");
        assert_eq!(
            store.stale_state(FILE, STRIPE, now),
            tessera_store::StaleState::Orphaned,
            "{damage}"
        );
        assert_eq!(
            store.stale_state(FILE, STRIPE + 1, now),
            tessera_store::StaleState::Clean
        );
        drop(store);
        // Durably: a reopen still has it.
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.stale_records(), 1, "{damage}");
    }
}

#[test]
fn removing_a_file_removes_its_records_and_a_wiped_store_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _, _) = recorded(dir.path());
    store.remove(FILE).unwrap();
    assert_eq!(store.intent(FILE, STRIPE).unwrap(), None);
    drop(store);
    let (store, _, _) = recorded(dir.path());
    drop(store);
    // A store that lost its `store.toml` but holds files is refused, never started afresh
    // (which would delete what it holds).
    std::fs::remove_file(dir.path().join("store.toml")).unwrap();
    let refused = Store::open(dir.path()).expect_err("refused");
    assert!(refused.to_string().contains("store.toml"), "{refused}");
    // Wiped whole, it starts afresh with no record.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            std::fs::remove_dir_all(path).unwrap();
        }
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.intent(FILE, STRIPE).unwrap(), None);
}

/// A record deleted from under the store (its directory entry lost, a stray `rm`) looks like
/// a resolved one; the directory's roster names it, so its stripe is kept as stale parity.
/// A record cleared by its holder leaves nothing behind.
#[test]
fn a_deleted_record_is_found_and_a_cleared_one_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _, _) = recorded(dir.path());
    store
        .record_intent(FILE, STRIPE + 1, &intent(), &pattern(7388, 1))
        .unwrap();
    store.clear_intent(FILE, STRIPE + 1).unwrap();
    drop(store);
    let path = dir.path().join("intents").join(format!("{FILE}.{STRIPE}"));
    std::fs::remove_file(&path).unwrap();
    let store = Store::open(dir.path()).unwrap();
    let now = tokio::time::Instant::now();
    assert_eq!(store.intent(FILE, STRIPE).unwrap(), None);
    let orphaned = tessera_store::StaleState::Orphaned;
    assert_eq!(store.stale_state(FILE, STRIPE, now), orphaned);
    assert_eq!(store.stale_records(), 1);
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let now = tokio::time::Instant::now();
    assert_eq!(store.stale_state(FILE, STRIPE, now), orphaned);
    assert_eq!(store.stale_records(), 1);
}

/// A store on the in-memory disk with a parity unit written and synced, then a record taken
/// over it (not synced).
fn recorded_in_memory() -> (tessera_store::MemDisk, &'static Path, Store, Vec<u8>) {
    let disk = tessera_store::MemDisk::new();
    let root = Path::new("/store");
    let store = Store::open_on(disk.shared(), root).unwrap();
    let parity = pattern(UNIT as usize, 7);
    store
        .write(FILE, Region::Redundancy, UNIT, &parity, false)
        .unwrap();
    store.sync().unwrap();
    assert!(!store.unsynced_mark_present());
    let old_data = pattern(7388, 40);
    store
        .record_intent(FILE, STRIPE, &intent(), &old_data)
        .unwrap();
    let expected = [&parity[4096..12288], &old_data[..]].concat();
    (disk, root, store, expected)
}

/// A record is answered before it is synced (no `fdatasync`, no directory sync: they cost
/// every read-modify-write two sync calls), so the store's `unsynced` mark must be durable
/// first: a power loss before the next sync then renews the whole store (it is rebuilt from
/// the others, and its parity with it), however much of the record it dropped.
#[test]
fn a_record_is_answered_unsynced_under_the_mark_and_a_power_loss_renews_the_store() {
    for seed in 0..20 {
        let (disk, root, store, _) = recorded_in_memory();
        assert!(store.unsynced_mark_present(), "seed {seed}");
        let incarnation = store.incarnation();
        drop(store);
        disk.power_loss(seed);
        let after = Store::open_on(disk.snapshot().shared(), root).unwrap();
        assert_ne!(after.incarnation(), incarnation, "seed {seed}: not renewed");
        assert_eq!(after.intent(FILE, STRIPE).unwrap(), None, "seed {seed}");
    }
}

/// The sync after a record makes it durable (and only then removes the mark): a power loss
/// after the sync keeps the store's incarnation and the record, whole. One cleared before
/// the sync is gone after it, and the mark with it.
#[test]
fn the_next_sync_makes_a_record_durable_and_a_cleared_one_stays_gone() {
    for clear in [false, true] {
        let (disk, root, store, expected) = recorded_in_memory();
        if clear {
            store.clear_intent(FILE, STRIPE).unwrap();
        }
        store.clear_unsynced_mark().unwrap();
        assert!(store.unsynced_mark_present(), "owed a sync: kept");
        store.sync().unwrap();
        assert!(!store.unsynced_mark_present(), "clear: {clear}");
        let incarnation = store.incarnation();
        drop(store);
        disk.crash();
        let after = Store::open_on(disk.snapshot().shared(), root).unwrap();
        assert_eq!(after.incarnation(), incarnation, "clear: {clear}");
        let record = after.intent(FILE, STRIPE).unwrap();
        assert_eq!(
            record,
            (!clear).then(|| (intent(), expected)),
            "clear: {clear}"
        );
    }
}
