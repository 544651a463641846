//! CSAR 4 (Hybrid): overflow regions, their table, its log and its replay.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tessera_store::{OverflowExtent, OverflowRole, Region, StorageError, Store};

const FILE: u64 = 9;

fn on_disk(root: &Path, name: &str) -> PathBuf {
    root.join("files").join(FILE.to_string()).join(name)
}

fn extent(offset: u64, len: u32) -> OverflowExtent {
    OverflowExtent { offset, len }
}

fn list(
    store: &Store,
    role: OverflowRole,
    offset: u64,
    len: u64,
) -> (Vec<OverflowExtent>, Vec<u8>) {
    store.overflow_list(FILE, role, offset, len).unwrap()
}

/// A file whose data is `d` x 100, with primary entries `A` at 10..30 and then `B` at 20..40,
/// and a mirror entry `M` at 0..50.
fn populated(root: &Path) -> Store {
    let store = Store::open(root).unwrap();
    store
        .write(FILE, Region::Data, 0, &[b'd'; 100], false)
        .unwrap();
    store
        .overflow_write(FILE, OverflowRole::Primary, 10, &[b'A'; 20])
        .unwrap();
    store
        .overflow_write(FILE, OverflowRole::Primary, 20, &[b'B'; 20])
        .unwrap();
    store
        .overflow_write(FILE, OverflowRole::Mirror, 0, &[b'M'; 50])
        .unwrap();
    store
}

fn expected_overlay() -> Vec<u8> {
    let mut bytes = vec![b'd'; 100];
    bytes[10..20].fill(b'A');
    bytes[20..40].fill(b'B');
    bytes
}

#[test]
fn csar_4_overlay_read_returns_the_newest_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    assert_eq!(
        store.read(FILE, Region::Data, 0, 100, true).unwrap(),
        expected_overlay()
    );
    assert_eq!(
        store.read(FILE, Region::Data, 0, 100, false).unwrap(),
        vec![b'd'; 100]
    );
    // Clipped to the request, and past the end of the data file.
    assert_eq!(
        store.read(FILE, Region::Data, 15, 10, true).unwrap(),
        b"AAAAABBBBB"
    );
    store
        .overflow_write(FILE, OverflowRole::Primary, 5000, b"far")
        .unwrap();
    assert_eq!(
        store.read(FILE, Region::Data, 4999, 5, true).unwrap(),
        b"\0far\0"
    );
    // Mirror entries are not overlaid: they belong to the previous column's data.
    assert_eq!(
        store.read(FILE, Region::Data, 45, 10, true).unwrap(),
        vec![b'd'; 10]
    );
}

#[test]
fn invalidate_trims_partially_and_list_clips_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    let (extents, bytes) = list(&store, OverflowRole::Primary, 0, 100);
    assert_eq!(extents, vec![extent(10, 10), extent(20, 20)]);
    assert_eq!(bytes, [vec![b'A'; 10], vec![b'B'; 20]].concat());

    // Newest-written listed last even when it sits at a lower offset.
    store
        .overflow_write(FILE, OverflowRole::Primary, 0, b"CC")
        .unwrap();
    let (extents, bytes) = list(&store, OverflowRole::Primary, 1, 24);
    assert_eq!(extents, vec![extent(10, 10), extent(20, 5), extent(1, 1)]);
    assert_eq!(bytes, b"AAAAAAAAAABBBBBC");

    // Cut a hole in the middle of B and trim the start of A.
    store
        .overflow_invalidate(FILE, OverflowRole::Primary, 25, 5)
        .unwrap();
    store
        .overflow_invalidate(FILE, OverflowRole::Primary, 0, 12)
        .unwrap();
    let (extents, bytes) = list(&store, OverflowRole::Primary, 0, 100);
    assert_eq!(extents, vec![extent(12, 8), extent(20, 5), extent(30, 10)]);
    assert_eq!(bytes, b"AAAAAAAABBBBBBBBBBBBBBB");
    let mut expected = vec![b'd'; 100];
    expected[12..20].fill(b'A');
    expected[20..25].fill(b'B');
    expected[30..40].fill(b'B');
    assert_eq!(
        store.read(FILE, Region::Data, 0, 100, true).unwrap(),
        expected
    );

    // Roles are separate tables.
    let (extents, bytes) = list(&store, OverflowRole::Mirror, 40, 1000);
    assert_eq!(extents, vec![extent(40, 10)]);
    assert_eq!(bytes, vec![b'M'; 10]);
    let (extents, bytes) = list(&store, OverflowRole::Mirror, 50, 10);
    assert!(extents.is_empty() && bytes.is_empty());
}

#[test]
fn csar_4_full_stripe_write_invalidates_primary_overflow_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    store
        .write(FILE, Region::Data, 15, &[b'w'; 10], true)
        .unwrap();
    let mut expected = expected_overlay();
    expected[15..25].fill(b'w');
    assert_eq!(
        store.read(FILE, Region::Data, 0, 100, true).unwrap(),
        expected
    );
    let (extents, _) = list(&store, OverflowRole::Primary, 0, 100);
    assert_eq!(extents, vec![extent(10, 5), extent(25, 15)]);
    // The mirror copy is another server's business (it is invalidated by its own request).
    let (extents, _) = list(&store, OverflowRole::Mirror, 0, 100);
    assert_eq!(extents, vec![extent(0, 50)]);
    // Without the flag, overflow keeps shadowing the write.
    store
        .write(FILE, Region::Data, 30, &[b'x'; 5], false)
        .unwrap();
    assert_eq!(
        store.read(FILE, Region::Data, 30, 5, true).unwrap(),
        b"BBBBB"
    );
}

#[test]
fn overflow_table_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    store
        .overflow_invalidate(FILE, OverflowRole::Primary, 12, 3)
        .unwrap();
    store
        .overflow_invalidate(FILE, OverflowRole::Mirror, 45, 100)
        .unwrap();
    let primary = list(&store, OverflowRole::Primary, 0, 100);
    let mirror = list(&store, OverflowRole::Mirror, 0, 100);
    let overlay = store.read(FILE, Region::Data, 0, 100, true).unwrap();
    let usage = store.usage(FILE).unwrap();
    store.sync().unwrap();
    drop(store);

    let store = Store::open(dir.path()).unwrap();
    assert_eq!(list(&store, OverflowRole::Primary, 0, 100), primary);
    assert_eq!(list(&store, OverflowRole::Mirror, 0, 100), mirror);
    assert_eq!(
        store.read(FILE, Region::Data, 0, 100, true).unwrap(),
        overlay
    );
    assert_eq!(store.usage(FILE).unwrap(), usage);
    // And keeps working: appends after replay land after the replayed records.
    store
        .overflow_write(FILE, OverflowRole::Primary, 0, b"Z")
        .unwrap();
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.read(FILE, Region::Data, 0, 2, true).unwrap(), b"Zd");
    assert_eq!(list(&store, OverflowRole::Mirror, 0, 100), mirror);
}

#[test]
fn a_torn_tail_of_the_log_is_dropped_on_reopen() {
    // A record cut short, zeros where a record was not filled in yet, or both.
    for torn in [
        &[1, 2, 3][..],
        &[0u8; 36][..],
        &[0u8; 50][..],
        &[0u8; 72][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = populated(dir.path());
        let primary = list(&store, OverflowRole::Primary, 0, 100);
        let mirror = list(&store, OverflowRole::Mirror, 0, 100);
        drop(store);
        let log_path = on_disk(dir.path(), "overflow.log");
        let log_len = std::fs::metadata(&log_path).unwrap().len();
        let mut log = OpenOptions::new().append(true).open(&log_path).unwrap();
        log.write_all(torn).unwrap();
        drop(log);

        let store = Store::open(dir.path()).unwrap();
        assert_eq!(list(&store, OverflowRole::Primary, 0, 100), primary);
        assert_eq!(list(&store, OverflowRole::Mirror, 0, 100), mirror);
        assert_eq!(
            store.read(FILE, Region::Data, 0, 100, true).unwrap(),
            expected_overlay()
        );
        assert_eq!(std::fs::metadata(&log_path).unwrap().len(), log_len);
        // New records go where the torn tail was, and replay again.
        store
            .overflow_write(FILE, OverflowRole::Primary, 0, b"N")
            .unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.read(FILE, Region::Data, 0, 1, true).unwrap(), b"N");
    }
}

/// The corrupt answer for a damaged log: every range of both roles.
fn damaged_at(offset: u64) -> Result<(Vec<OverflowExtent>, Vec<u8>), StorageError> {
    Err(StorageError::Corrupt {
        file: FILE,
        region: Region::Data,
        offset,
    })
}

#[test]
fn a_damaged_record_is_corrupt_until_rewritten_never_a_silent_loss() {
    // The second record (B), the last one (M), and a whole garbage record at the tail: none
    // may be taken for a torn tail and dropped, since each may have been synced.
    let record_b = 12 + 36 + 9;
    let record_m = 12 + 2 * 36 + 20;
    for at in [record_b, record_m, 12 + 3 * 36 + 5] {
        let dir = tempfile::tempdir().unwrap();
        drop(populated(dir.path()));
        let log_path = on_disk(dir.path(), "overflow.log");
        let log_len = std::fs::metadata(&log_path).unwrap().len();
        let log = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&log_path)
            .unwrap();
        if at >= log_len {
            log.write_all_at(&[0xab; 36], log_len).unwrap();
        } else {
            let mut byte = [0u8];
            log.read_exact_at(&mut byte, at).unwrap();
            log.write_all_at(&[byte[0] ^ 0x04], at).unwrap();
        }
        drop(log);
        let store = Store::open(dir.path()).unwrap();
        let primary = store.overflow_list(FILE, OverflowRole::Primary, 0, 100);
        assert_eq!(primary, damaged_at(0), "flip at {at}");
        let read = store.read(FILE, Region::Data, 30, 10, true);
        assert_eq!(read.map(|_| ()), damaged_at(30).map(|_| ()), "flip at {at}");
        assert_eq!(
            store.overflow_list(FILE, OverflowRole::Mirror, 60, 10),
            damaged_at(60)
        );
        // A read without overlay does not depend on the log.
        assert_eq!(
            store.read(FILE, Region::Data, 0, 100, false).unwrap(),
            vec![b'd'; 100]
        );
        // The client's repair: the base rewritten with the primary's entries trimmed, the
        // entries written again from the other copy, the mirror role invalidated and
        // rewritten. Damage is gone where it was rewritten, and stays gone after a reopen.
        store
            .write(FILE, Region::Data, 0, &[b'd'; 100], true)
            .unwrap();
        store
            .overflow_write(FILE, OverflowRole::Primary, 10, &[b'A'; 10])
            .unwrap();
        store
            .overflow_write(FILE, OverflowRole::Primary, 20, &[b'B'; 20])
            .unwrap();
        store
            .overflow_invalidate(FILE, OverflowRole::Mirror, 0, 100)
            .unwrap();
        store
            .overflow_write(FILE, OverflowRole::Mirror, 0, &[b'M'; 50])
            .unwrap();
        let check = |store: &Store| {
            assert_eq!(
                store.read(FILE, Region::Data, 0, 100, true).unwrap(),
                expected_overlay()
            );
            let (_, mirror) = list(store, OverflowRole::Mirror, 0, 100);
            assert_eq!(mirror, vec![b'M'; 50]);
            assert_eq!(
                store.overflow_list(FILE, OverflowRole::Primary, 100, 10),
                damaged_at(100),
                "outside what was rewritten, the damage stays"
            );
        };
        check(&store);
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        check(&store);
        // Once no entry is live, the log keeps only the damaged ranges (one per role, past
        // 100): the damaged record is gone from the disk, and the byte file is emptied.
        for role in [OverflowRole::Primary, OverflowRole::Mirror] {
            store.overflow_invalidate(FILE, role, 0, 100).unwrap();
        }
        store.sync().unwrap();
        let overflow_path = on_disk(dir.path(), "overflow");
        assert_eq!(std::fs::metadata(&overflow_path).unwrap().len(), 0);
        assert_eq!(std::fs::metadata(&log_path).unwrap().len(), 12 + 2 * 36);
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.read(FILE, Region::Data, 0, 100, true).unwrap(),
            vec![b'd'; 100]
        );
        assert_eq!(
            store.overflow_list(FILE, OverflowRole::Mirror, 100, 10),
            damaged_at(100)
        );
        // Appends after the replacement are synced and replayed like any others.
        store
            .overflow_write(FILE, OverflowRole::Primary, 100, b"new")
            .unwrap();
        store.sync().unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.read(FILE, Region::Data, 100, 3, true).unwrap(),
            b"new"
        );
        assert_eq!(
            store.overflow_list(FILE, OverflowRole::Primary, 103, 10),
            damaged_at(103)
        );
    }
}

#[test]
fn corrupt_overflow_bytes_are_reported_and_never_returned() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    // Entry B's bytes are at 20..40 of the overflow file.
    let overflow = OpenOptions::new()
        .read(true)
        .write(true)
        .open(on_disk(dir.path(), "overflow"))
        .unwrap();
    overflow.write_all_at(b"?", 33).unwrap();
    let corrupt = StorageError::Corrupt {
        file: FILE,
        region: Region::Data,
        offset: 20,
    };
    assert_eq!(
        store.read(FILE, Region::Data, 0, 100, true),
        Err(corrupt.clone())
    );
    assert_eq!(
        store.overflow_list(FILE, OverflowRole::Primary, 35, 1),
        Err(corrupt)
    );
    // Untouched entries and the plain data file still read.
    assert_eq!(
        store.read(FILE, Region::Data, 0, 20, true).unwrap()[10..],
        [b'A'; 10]
    );
    assert_eq!(
        store.read(FILE, Region::Data, 0, 100, false).unwrap(),
        vec![b'd'; 100]
    );
    let (_, mirror) = list(&store, OverflowRole::Mirror, 0, 100);
    assert_eq!(mirror, vec![b'M'; 50]);
    // A trimmed piece still checks the whole entry it came from.
    store
        .overflow_invalidate(FILE, OverflowRole::Primary, 20, 15)
        .unwrap();
    let corrupt_piece = Err(StorageError::Corrupt {
        file: FILE,
        region: Region::Data,
        offset: 35,
    });
    assert_eq!(store.read(FILE, Region::Data, 36, 2, true), corrupt_piece);
    // Invalidating the damaged entry entirely makes reads whole again.
    store
        .overflow_invalidate(FILE, OverflowRole::Primary, 35, 5)
        .unwrap();
    assert_eq!(
        store.read(FILE, Region::Data, 30, 20, true).unwrap(),
        vec![b'd'; 20]
    );
}

#[test]
fn files_are_emptied_once_no_entry_is_live() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    let overflow_path = on_disk(dir.path(), "overflow");
    let log_path = on_disk(dir.path(), "overflow.log");
    store
        .overflow_invalidate(FILE, OverflowRole::Primary, 0, 100)
        .unwrap();
    assert!(std::fs::metadata(&log_path).unwrap().len() > 0);
    store
        .overflow_invalidate(FILE, OverflowRole::Mirror, 0, 50)
        .unwrap();
    assert_eq!(std::fs::metadata(&overflow_path).unwrap().len(), 0);
    assert_eq!(std::fs::metadata(&log_path).unwrap().len(), 0);
    assert_eq!(store.usage(FILE).unwrap(), 4096);
    // A fresh start writes a fresh header.
    store
        .overflow_write(FILE, OverflowRole::Mirror, 3, b"again")
        .unwrap();
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let (extents, bytes) = list(&store, OverflowRole::Mirror, 0, 10);
    assert_eq!(extents, vec![extent(3, 5)]);
    assert_eq!(bytes, b"again");
    // Invalidating where nothing is live logs nothing.
    let log_len = std::fs::metadata(&log_path).unwrap().len();
    store
        .overflow_invalidate(FILE, OverflowRole::Primary, 0, 1000)
        .unwrap();
    store
        .overflow_invalidate(FILE + 1, OverflowRole::Primary, 0, 1000)
        .unwrap();
    assert_eq!(std::fs::metadata(&log_path).unwrap().len(), log_len);
    assert!(!dir
        .path()
        .join("files")
        .join((FILE + 1).to_string())
        .exists());
}

#[test]
fn a_damaged_log_header_is_rewritten_and_costs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    drop(populated(dir.path()));
    let log_path = on_disk(dir.path(), "overflow.log");
    let header = std::fs::read(&log_path).unwrap()[..12].to_vec();
    for at in 0..12 {
        let log = OpenOptions::new().write(true).open(&log_path).unwrap();
        log.write_all_at(&[header[at] ^ 0x20], at as u64).unwrap();
        drop(log);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.read(FILE, Region::Data, 0, 100, true).unwrap(),
            expected_overlay(),
            "flip in header byte {at}"
        );
        drop(store);
        assert_eq!(std::fs::read(&log_path).unwrap()[..12], header[..]);
    }
}

/// A repair of a damaged log from the other copy touches only what is still damaged: an entry
/// written after the damage (a write whose other copy may still be on the way) keeps its
/// bytes, the other copy's entries fill the rest of the damaged range, and where that copy
/// holds none the range reads the base again. A repair that overlaps or lies outside its
/// range, or whose entries do not add up to its bytes, is refused and changes nothing.
#[test]
fn a_damaged_range_is_repaired_around_entries_written_since() {
    let dir = tempfile::tempdir().unwrap();
    drop(populated(dir.path()));
    let log_path = on_disk(dir.path(), "overflow.log");
    let log = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&log_path)
        .unwrap();
    let mut byte = [0u8];
    log.read_exact_at(&mut byte, 12 + 36 + 9).unwrap();
    log.write_all_at(&[byte[0] ^ 0x04], 12 + 36 + 9).unwrap();
    drop(log);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(
        store.overflow_list(FILE, OverflowRole::Primary, 0, 100),
        damaged_at(0)
    );
    // A write lands on the primary after the damage: `W` at 25..35.
    store
        .overflow_write(FILE, OverflowRole::Primary, 25, &[b'W'; 10])
        .unwrap();
    // The other copy's entries (which the write has not reached): `A` at 10..20, `B` at 20..40.
    let entries = [extent(10, 10), extent(20, 20)];
    let mut bytes = vec![b'A'; 10];
    bytes.extend_from_slice(&[b'B'; 20]);
    for (bad, payload) in [
        (vec![extent(20, 20), extent(10, 10)], bytes.clone()),
        (vec![extent(95, 10)], vec![b'x'; 10]),
        (entries.to_vec(), bytes[..29].to_vec()),
    ] {
        let refused =
            store.overflow_repair_damaged(FILE, OverflowRole::Primary, 0, 100, &bad, &payload);
        assert!(
            matches!(refused, Err(StorageError::BadRequest { .. })),
            "{bad:?}"
        );
    }
    store
        .overflow_repair_damaged(FILE, OverflowRole::Primary, 0, 100, &entries, &bytes)
        .unwrap();
    let mut expected = vec![b'd'; 100];
    expected[10..20].fill(b'A');
    expected[20..40].fill(b'B');
    expected[25..35].fill(b'W');
    assert_eq!(
        store.read(FILE, Region::Data, 0, 100, true).unwrap(),
        expected
    );
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(
        store.read(FILE, Region::Data, 0, 100, true).unwrap(),
        expected,
        "the same after a replay of the log"
    );
    // Only the primary role was repaired: the mirror's range past its entry written after
    // the damaged record (`M` at 0..50) is still damaged.
    assert_eq!(
        store.overflow_list(FILE, OverflowRole::Mirror, 0, 100),
        damaged_at(50)
    );
}

/// An entry whose bytes fail their checksum is repaired from the other copy the same way, and
/// only it: the entries beside it that verify keep their bytes.
#[test]
fn an_entry_with_failing_bytes_is_repaired_and_only_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    // `A` is written first at position 0 of the byte file: flip one of its bytes.
    drop(store);
    let bytes_path = on_disk(dir.path(), "overflow");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&bytes_path)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, 3).unwrap();
    file.write_all_at(&[byte[0] ^ 0x10], 3).unwrap();
    drop(file);
    let store = Store::open(dir.path()).unwrap();
    assert!(matches!(
        store.overflow_list(FILE, OverflowRole::Primary, 0, 100),
        Err(StorageError::Corrupt { .. })
    ));
    // The other copy holds `a` where `A` was live (10..20) and `b` over 20..40; only the
    // failing entry's live part takes the other copy's bytes, `B` stays.
    let entries = [extent(10, 10), extent(20, 20)];
    let mut bytes = vec![b'a'; 10];
    bytes.extend_from_slice(&[b'b'; 20]);
    store
        .overflow_repair_damaged(FILE, OverflowRole::Primary, 0, 100, &entries, &bytes)
        .unwrap();
    let mut expected = vec![b'd'; 100];
    expected[10..20].fill(b'a');
    expected[20..40].fill(b'B');
    assert_eq!(
        store.read(FILE, Region::Data, 0, 100, true).unwrap(),
        expected
    );
}

/// A repair at the limits of the offset type is refused, never wrapped around: a range that
/// ends past the largest file, and an entry whose end overflows `u64`.
#[test]
fn a_repair_at_the_offsets_limits_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    let before = store.read(FILE, Region::Data, 0, 100, true).unwrap();
    for (offset, len, entry) in [
        (u64::MAX - 10, 100, extent(u64::MAX - 5, 10)),
        (0, 100, extent(u64::MAX - 3, 10)),
    ] {
        let refused = store.overflow_repair_damaged(
            FILE,
            OverflowRole::Primary,
            offset,
            len,
            &[entry],
            &[b'x'; 10],
        );
        assert!(
            matches!(refused, Err(StorageError::BadRequest { .. })),
            "{offset}+{len}: {refused:?}"
        );
    }
    assert_eq!(
        store.read(FILE, Region::Data, 0, 100, true).unwrap(),
        before
    );
}
