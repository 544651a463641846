//! Stale-parity records of full-stripe writes: written before the answer under the durable
//! `unsynced` mark (a power loss before the next sync renews the store; the sync makes the
//! record durable), live while leased,
//! orphaned when the lease runs out or the server restarts, cleared by their writer, shrunk by
//! resolutions (never while live), dropped with their file, dropped when torn, and kept when
//! damaged.

use std::time::Duration;

use tessera_store::{StaleState, StorageError, Store, STALE_FORMAT_VERSION};
use tessera_wire::IndexRange;
use tokio::time::Instant;

const FILE: u64 = 9;
const LEASE: Duration = Duration::from_millis(600);

fn live(state: StaleState) -> bool {
    matches!(state, StaleState::Live { .. })
}

#[test]
fn a_record_is_live_while_leased_then_orphaned() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let now = Instant::now();
    let token = store
        .record_stale(FILE, IndexRange::new(4, 8), now + LEASE)
        .unwrap();
    assert!(live(store.stale_state(FILE, 4, now)));
    assert!(live(store.stale_state(FILE, 7, now)));
    assert_eq!(store.stale_state(FILE, 8, now), StaleState::Clean);
    assert_eq!(store.stale_state(FILE, 3, now), StaleState::Clean);
    assert_eq!(store.stale_state(FILE + 1, 5, now), StaleState::Clean);
    let later = now + LEASE;
    assert_eq!(store.stale_state(FILE, 5, later), StaleState::Orphaned);
    store.renew_stale(FILE, token, later + LEASE).unwrap();
    assert!(live(store.stale_state(FILE, 5, later)));
    assert_eq!(
        store.renew_stale(FILE, token + 1, later),
        Err(StorageError::StaleLock {
            stripe: 0,
            token: token + 1
        })
    );
    assert!(store.renew_stale(FILE + 1, token, later).is_err());
}

#[test]
fn the_writer_clears_its_record_and_the_orphans_under_its_stripes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let now = Instant::now();
    let orphan = store
        .record_stale(FILE, IndexRange::new(0, 10), now)
        .unwrap();
    let other = store
        .record_stale(FILE, IndexRange::new(2, 6), now + LEASE)
        .unwrap();
    let mine = store
        .record_stale(FILE, IndexRange::new(4, 6), now + LEASE)
        .unwrap();
    assert_ne!(orphan, other);
    store
        .clear_stale(FILE, Some(mine), IndexRange::new(4, 6), now)
        .unwrap();
    // Stripes 4 and 5 were rewritten whole: out of the orphan, and of the other writer's
    // record too; the rest of both stays.
    assert_eq!(store.stale_state(FILE, 4, now), StaleState::Clean);
    assert_eq!(store.stale_state(FILE, 5, now), StaleState::Clean);
    assert!(live(store.stale_state(FILE, 3, now)));
    assert_eq!(store.stale_records(), 2);
    let later = now + LEASE;
    for stripe in [0, 1, 3, 6, 9] {
        assert_eq!(store.stale_state(FILE, stripe, later), StaleState::Orphaned);
    }
    store
        .clear_stale(FILE, Some(other), IndexRange::new(2, 6), later)
        .unwrap();
    for stripe in [2, 3, 4, 5, 10] {
        assert_eq!(store.stale_state(FILE, stripe, later), StaleState::Clean);
    }
    // A resolution (no token) of the last stripes of the split orphan deletes it.
    store
        .clear_stale(FILE, None, IndexRange::new(0, 2), later)
        .unwrap();
    store
        .clear_stale(FILE, None, IndexRange::new(6, 10), later)
        .unwrap();
    assert_eq!(store.stale_records(), 0);
    assert_eq!(record_names(dir.path()), Vec::<String>::new());
}

#[test]
fn a_resolution_never_clears_a_live_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let now = Instant::now();
    store
        .record_stale(FILE, IndexRange::new(1, 3), now + LEASE)
        .unwrap();
    store
        .clear_stale(FILE, None, IndexRange::new(0, 10), now)
        .unwrap();
    assert!(live(store.stale_state(FILE, 2, now)));
}

#[test]
fn records_survive_a_restart_orphaned_and_shrunk() {
    let dir = tempfile::tempdir().unwrap();
    let now = Instant::now();
    {
        let store = Store::open(dir.path()).unwrap();
        store
            .record_stale(FILE, IndexRange::new(0, 10), now)
            .unwrap();
        store
            .clear_stale(FILE, None, IndexRange::new(3, 5), now + LEASE)
            .unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let after = Instant::now();
    for stripe in [0, 2, 5, 9] {
        assert_eq!(store.stale_state(FILE, stripe, after), StaleState::Orphaned);
    }
    for stripe in [3, 4, 10] {
        assert_eq!(store.stale_state(FILE, stripe, after), StaleState::Clean);
    }
    // Its writer, still alive, renews it: live again.
    let token = first_token(dir.path());
    store.renew_stale(FILE, token, after + LEASE).unwrap();
    assert!(live(store.stale_state(FILE, 0, after)));
    // A new record never reuses a token seen on disk.
    let again = store
        .record_stale(FILE, IndexRange::new(20, 21), after + LEASE)
        .unwrap();
    assert!(again > token);
}

/// A record under its staging name was torn while being recorded (never answered): dropped.
/// One under its own name was answered: damaged (a flipped bit, cut short), it is kept as
/// covering the stripes its name gives, and written whole again.
#[test]
fn torn_records_are_dropped_and_damaged_ones_kept_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let now = Instant::now();
    {
        let store = Store::open(dir.path()).unwrap();
        store
            .record_stale(FILE, IndexRange::new(0, 2), now)
            .unwrap();
        store
            .record_stale(FILE, IndexRange::new(5, 7), now)
            .unwrap();
    }
    let stale = dir.path().join("stale");
    let paths: Vec<_> = (record_names(dir.path()).iter())
        .map(|name| stale.join(name))
        .collect();
    let mut bytes = std::fs::read(&paths[0]).unwrap();
    assert_eq!(&bytes[..4], b"TSSP");
    assert_eq!(
        u32::from_le_bytes(bytes[4..8].try_into().unwrap()),
        STALE_FORMAT_VERSION
    );
    bytes[20] ^= 1;
    std::fs::write(&paths[0], &bytes).unwrap();
    let cut = std::fs::read(&paths[1]).unwrap();
    std::fs::write(&paths[1], &cut[..cut.len() - 3]).unwrap();
    let torn = stale.join(format!("{FILE}.99.10-12.new"));
    std::fs::write(&torn, &cut[..cut.len() - 3]).unwrap();
    let store = Store::open(dir.path()).unwrap();
    let now = Instant::now();
    assert_eq!(store.stale_records(), 2);
    for stripe in [0, 1, 5, 6] {
        assert_eq!(store.stale_state(FILE, stripe, now), StaleState::Orphaned);
    }
    for stripe in [2, 4, 7, 10, 11] {
        assert_eq!(store.stale_state(FILE, stripe, now), StaleState::Clean);
    }
    assert!(!torn.exists());
    // Written whole again.
    assert_eq!(std::fs::read(&paths[1]).unwrap(), cut);
}

#[test]
fn removing_a_file_drops_its_records_and_a_record_of_nothing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let now = Instant::now();
    store
        .record_stale(FILE, IndexRange::new(0, 2), now)
        .unwrap();
    store
        .record_stale(FILE + 1, IndexRange::new(0, 2), now)
        .unwrap();
    store.remove(FILE).unwrap();
    assert_eq!(store.stale_state(FILE, 1, now), StaleState::Clean);
    assert_eq!(store.stale_state(FILE + 1, 1, now), StaleState::Orphaned);
    assert!(matches!(
        store.record_stale(FILE, IndexRange::new(3, 3), now),
        Err(StorageError::BadRequest { .. })
    ));
}

/// The token of the one record on disk (its file is named `<file>.<token>.<stripes>`).
fn first_token(root: &std::path::Path) -> u64 {
    let names = record_names(root);
    names[0].split('.').nth(1).unwrap().parse().unwrap()
}

/// The names of the record files on disk (not the directory's roster).
fn record_names(root: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("stale"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "roster")
        .collect();
    names.sort();
    names
}

/// A record deleted from under the store looks like a cleared one; the directory's roster
/// names it, and its name gives its stripes, so they stay orphaned. A cleared record leaves
/// nothing behind.
#[test]
fn a_deleted_record_is_found_and_a_cleared_one_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let now = Instant::now();
    {
        let store = Store::open(dir.path()).unwrap();
        store
            .record_stale(FILE, IndexRange::new(3, 6), now)
            .unwrap();
        let cleared = store
            .record_stale(FILE, IndexRange::new(10, 12), now + LEASE)
            .unwrap();
        store
            .clear_stale(FILE, Some(cleared), IndexRange::new(10, 12), now)
            .unwrap();
        store.sync().unwrap();
    }
    let names = record_names(dir.path());
    assert_eq!(names.len(), 1);
    std::fs::remove_file(dir.path().join("stale").join(&names[0])).unwrap();
    let store = Store::open(dir.path()).unwrap();
    let now = Instant::now();
    assert_eq!(store.stale_records(), 1);
    for stripe in 3..6 {
        assert_eq!(store.stale_state(FILE, stripe, now), StaleState::Orphaned);
    }
    for stripe in [2, 6, 10, 11] {
        assert_eq!(store.stale_state(FILE, stripe, now), StaleState::Clean);
    }
    assert_eq!(record_names(dir.path()), names);
}

/// A record is answered before it is synced, as an intent record is: the `unsynced` mark is
/// durable first, so a power loss before the next sync renews the store, records and all;
/// after the sync one survives a power loss that drops everything unsynced, and the mark
/// is gone. One cleared before the sync is gone after it.
#[test]
fn a_record_is_answered_unsynced_under_the_mark_and_durable_from_the_next_sync() {
    use std::path::Path;
    for (sync, clear) in [(false, false), (true, false), (true, true)] {
        let what = format!("sync {sync}, clear {clear}");
        let disk = tessera_store::MemDisk::new();
        let root = Path::new("/store");
        let store = Store::open_on(disk.shared(), root).unwrap();
        let now = Instant::now();
        let token = store
            .record_stale(FILE, IndexRange::new(4, 8), now + LEASE)
            .unwrap();
        assert!(store.unsynced_mark_present(), "{what}");
        if clear {
            store
                .clear_stale(FILE, Some(token), IndexRange::new(4, 8), now)
                .unwrap();
        }
        if sync {
            store.clear_unsynced_mark().unwrap();
            assert!(store.unsynced_mark_present(), "{what}: owed a sync, kept");
            store.sync().unwrap();
            assert!(!store.unsynced_mark_present(), "{what}");
        }
        let incarnation = store.incarnation();
        drop(store);
        disk.crash();
        if sync && !clear {
            // A 16-byte header and one range of two u64s.
            assert_eq!(record_sizes(&disk, root), vec![32], "{what}: whole on disk");
        }
        let after = Store::open_on(disk.snapshot().shared(), root).unwrap();
        assert_eq!(after.incarnation() == incarnation, sync, "{what}: renewed");
        let expected = match sync && !clear {
            true => StaleState::Orphaned,
            false => StaleState::Clean,
        };
        assert_eq!(
            after.stale_state(FILE, 5, Instant::now()),
            expected,
            "{what}"
        );
    }
}

/// The sizes of the stale-parity records' files on `disk` (the roster left out).
fn record_sizes(disk: &tessera_store::MemDisk, root: &std::path::Path) -> Vec<u64> {
    use tessera_store::Disk;
    let dir = root.join("stale");
    let names = disk.read_dir(&dir).unwrap();
    let records = names.iter().filter(|name| name.as_str() != "roster");
    (records.map(|name| disk.open_existing(&dir.join(name)).unwrap().size().unwrap())).collect()
}
