//! One flipped bit anywhere in a store's directory is found, never served, and put right by
//! rewriting from redundancy (issue 15, item 3).
//!
//! A store is filled as a Hybrid column would be (base data with a never-written block in the
//! middle, redundancy, overflow entries of both roles that shadow and trim each other), and its
//! answers to every read and listing, unit by unit, are kept as the model. Then, many times:
//! every file is put back as it was, one random bit of one random file is flipped, the store is
//! reopened, and every unit is read again. Each answer must be the model's bytes or
//! [`StorageError::Corrupt`]; a damaged `store.toml` must make `open` fail naming the file.
//! Units that answered corrupt are rewritten as the client's repair does (base with the
//! primary's entries trimmed, redundancy, mirror entries invalidated, entries written again
//! from the other copy), and then every answer must equal the model, before and after another
//! reopen. The seed is printed; `TESSERA_TEST_SEED` replays it, `TESSERA_FLIPS` sets the count,
//! and `TESSERA_FLIP_FILES` (names, comma-separated) flips bits in those files only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use tessera_layout::{Layout, Scheme};
use tessera_store::{
    FileRecord, IntentPiece, IntentRecord, OverflowExtent, OverflowRole, ParityIntent, Region,
    StaleState, StorageError, Store,
};
use tessera_wire::{FileMeta, IndexRange};

const FILE: u64 = 3;
/// Bytes of one stripe unit of the column.
const UNIT: u64 = 8 << 10;
/// Units of the column's data file.
const UNITS: u64 = 4;
/// Flips when `TESSERA_FLIPS` is not set.
const FLIPS_DEFAULT: u64 = 10_000;
/// The stripe an intent record is left on (its writer died between data and parity).
const INTENT_STRIPE: u64 = 1;
/// The stripes a stale-parity record is left on (its full-stripe writer died).
const STALE_STRIPES: IndexRange = IndexRange { start: 2, end: 4 };
/// Files with bytes no read depends on: overflow bytes of no live entry, a snapshot copy
/// file's bytes and checksum entries of blocks never copied.
const SPARSE: [&str; 5] = [
    "overflow",
    "snap.1.data",
    "snap.1.data.crc",
    "snap.1.redundancy",
    "snap.1.redundancy.crc",
];
/// The epoch of the file's snapshot.
const SNAPSHOT: u64 = 1;
/// Files the manager removed, buried here.
const BURIED: [u64; 4] = [10, 11, 12, 40];

type Listing = (Vec<OverflowExtent>, Vec<u8>);

/// What the store answers for one unit.
#[derive(Clone, Debug, PartialEq, Eq)]
struct UnitAnswers {
    base: Vec<u8>,
    newest: Vec<u8>,
    redundancy: Vec<u8>,
    primary: Listing,
    mirror: Listing,
}

/// Each answer of a unit: the bytes, or the error.
struct UnitResults {
    base: Result<Vec<u8>, StorageError>,
    newest: Result<Vec<u8>, StorageError>,
    redundancy: Result<Vec<u8>, StorageError>,
    primary: Result<Listing, StorageError>,
    mirror: Result<Listing, StorageError>,
}

fn seed() -> u64 {
    let seed = std::env::var("TESSERA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().next_u64());
    eprintln!("bit_flips: seed {seed} (set TESSERA_TEST_SEED={seed} to replay)");
    seed
}

fn random_bytes(rng: &mut StdRng, len: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len as usize];
    rng.fill_bytes(&mut bytes);
    bytes
}

/// Fills a store as a Hybrid column: base units (one block left unwritten), redundancy, and
/// overflow entries of both roles within units, some shadowing or trimming older ones.
fn populate(store: &Store, rng: &mut StdRng) {
    for unit in 0..UNITS {
        let offset = unit * UNIT;
        let mut base = random_bytes(rng, UNIT);
        if unit == 1 {
            // Block 2 of the data file stays never written (a zero checksum entry).
            base.truncate(4096);
            store
                .write(FILE, Region::Data, offset, &base, false)
                .unwrap();
        } else {
            store
                .write(FILE, Region::Data, offset, &base, false)
                .unwrap();
        }
        let redundancy = random_bytes(rng, UNIT);
        store
            .write(FILE, Region::Redundancy, offset, &redundancy, false)
            .unwrap();
    }
    // A snapshot, then writes over part of it: its journal and copy files, of both regions.
    store.snapshot_begin(&[FILE], SNAPSHOT).unwrap();
    for (region, unit) in [(Region::Data, 2), (Region::Redundancy, 3)] {
        let bytes = random_bytes(rng, UNIT / 2);
        store
            .write(FILE, region, unit * UNIT + 4096, &bytes, false)
            .unwrap();
    }
    for _ in 0..40 {
        let role = if rng.gen_bool(0.5) {
            OverflowRole::Primary
        } else {
            OverflowRole::Mirror
        };
        let unit = rng.gen_range(0..UNITS);
        let len = rng.gen_range(1..=UNIT / 4);
        let offset = unit * UNIT + rng.gen_range(0..=UNIT - len);
        match rng.gen_range(0..10) {
            // A partial-stripe write, now and then superseded by a full-stripe one.
            0 => store.overflow_invalidate(FILE, role, offset, len).unwrap(),
            _ => {
                let bytes = random_bytes(rng, len);
                store.overflow_write(FILE, role, offset, &bytes).unwrap();
            }
        }
    }
    leave_records(store, rng);
    store.sync().unwrap();
}

/// What a server keeps beside the bytes: the file's record, tombstones, and the records of
/// writers that died mid-write (an intent record of a read-modify-write, a stale-parity record
/// of a full-stripe write), as a parity column holds them until they are resolved.
fn leave_records(store: &Store, rng: &mut StdRng) {
    store.describe(&file_record().meta, true).unwrap();
    store.bury(&BURIED).unwrap();
    let old_data = random_bytes(rng, 700);
    store
        .record_intent(FILE, INTENT_STRIPE, &intent(), &old_data)
        .unwrap();
    let lease_end = tokio::time::Instant::now();
    store.record_stale(FILE, STALE_STRIPES, lease_end).unwrap();
}

/// A read-modify-write of two pieces inside the parity unit at unit 1 of the redundancy file.
fn intent() -> ParityIntent {
    ParityIntent {
        unit_offset: INTENT_STRIPE * UNIT,
        span_start: 1024,
        span_len: 4096,
        pieces: vec![
            IntentPiece {
                column: 0,
                offset_in_unit: 1024,
                len: 200,
            },
            IntentPiece {
                column: 2,
                offset_in_unit: 2000,
                len: 500,
            },
        ],
    }
}

fn file_record() -> FileRecord {
    FileRecord {
        meta: FileMeta {
            id: FILE,
            path: "a/file".into(),
            layout: Layout::new(Scheme::Hybrid, UNIT as u32, 4).unwrap(),
            servers: vec![3, 1, 4, 2],
            size: UNITS * UNIT * 3,
        },
        cluster: Some(0x1234_5678_9abc_def0),
        committed: true,
    }
}

/// What the store keeps beside the bytes, as left by [`leave_records`].
#[derive(Debug)]
struct Records {
    intent: IntentRecord,
}

fn records_of(store: &Store) -> Records {
    Records {
        intent: store
            .intent(FILE, INTENT_STRIPE)
            .unwrap()
            .expect("an intent"),
    }
}

/// What became of the records after damage, if anything (each is checked never to be lost
/// silently, see [`check_records`]).
#[derive(Debug, Default, PartialEq, Eq)]
struct RecordDamage {
    /// The intent record was damaged: its stripe is kept as stale parity.
    intent_made_stale: bool,
    /// The file's record lists as damaged or missing (recovery takes another column's).
    file_record_lost: bool,
}

/// Checks that nothing the records say was lost silently: the intent record reads exactly or
/// its stripe is under an orphaned stale-parity record (parity never trusted), the stale
/// stripes still are, every buried file still is, and the file's record reads exactly or is
/// listed damaged or missing. Panics otherwise.
fn check_records(store: &Store, model: &Records, context: &str) -> RecordDamage {
    let now = tokio::time::Instant::now();
    let stale = |stripe| store.stale_state(FILE, stripe, now) == StaleState::Orphaned;
    let intent_made_stale = match store.intent(FILE, INTENT_STRIPE) {
        Ok(Some(intent)) => {
            assert!(intent == model.intent, "{context}: a wrong intent record");
            false
        }
        Ok(None) => {
            assert!(
                stale(INTENT_STRIPE),
                "{context}: the intent record was lost"
            );
            true
        }
        Err(error) => panic!("{context}: reading the intent record: {error}"),
    };
    for stripe in STALE_STRIPES.start..STALE_STRIPES.end {
        assert!(
            stale(stripe),
            "{context}: stale stripe {stripe} taken as clean"
        );
    }
    for file in BURIED {
        assert!(store.is_buried(file), "{context}: file {file} unburied");
    }
    let page = store.records(0, 10).unwrap();
    let file_record_lost = match page.records.iter().find(|r| r.meta.id == FILE) {
        Some(record) => {
            assert_eq!(*record, file_record(), "{context}: a wrong file record");
            false
        }
        None => {
            let listed = page.damaged.contains(&FILE) || page.unrecorded.contains(&FILE);
            assert!(
                listed,
                "{context}: file record neither read nor listed: {page:?}"
            );
            true
        }
    };
    RecordDamage {
        intent_made_stale,
        file_record_lost,
    }
}

/// A store populated in a new directory, closed: the directory, the answers of its units,
/// and every file's bytes.
fn populated_store(rng: &mut StdRng) -> (tempfile::TempDir, Model, BTreeMap<PathBuf, Vec<u8>>) {
    let dir = tempfile::tempdir().unwrap();
    let model = {
        let store = Store::open(dir.path()).unwrap();
        store.set_membership(0x1234_5678_9abc_def0, 4).unwrap();
        populate(&store, rng);
        Model {
            snapshot: snapshot_of(&store),
            units: model_of(&store),
            records: records_of(&store),
        }
    };
    let pristine = snapshot(dir.path());
    (dir, model, pristine)
}

/// What a populated store answers: per unit, and its records.
struct Model {
    units: Vec<UnitAnswers>,
    /// Per unit, snapshot [`SNAPSHOT`]'s data and redundancy.
    snapshot: Vec<[Vec<u8>; 2]>,
    records: Records,
}

fn snapshot_answers(store: &Store, unit: u64) -> [Result<Vec<u8>, StorageError>; 2] {
    [Region::Data, Region::Redundancy]
        .map(|region| store.read_snapshot(FILE, region, unit * UNIT, UNIT as u32, SNAPSHOT))
}

fn snapshot_of(store: &Store) -> Vec<[Vec<u8>; 2]> {
    (0..UNITS)
        .map(|unit| snapshot_answers(store, unit).map(Result::unwrap))
        .collect()
}

/// Whether a snapshot read was refused (its server cannot tell the bytes; the client
/// reconstructs them from the other columns); panics if one served wrong bytes.
fn snapshot_refused(store: &Store, model: &[[Vec<u8>; 2]], context: &str) -> bool {
    let mut refused = false;
    for unit in 0..UNITS {
        let got = snapshot_answers(store, unit);
        for (got, want) in got.iter().zip(&model[unit as usize]) {
            refused |= exact_or_corrupt(&format!("{context}: snapshot of unit {unit}"), got, want);
        }
    }
    refused
}

fn answers(store: &Store, unit: u64) -> UnitResults {
    let offset = unit * UNIT;
    let len = UNIT as u32;
    UnitResults {
        base: store.read(FILE, Region::Data, offset, len, false),
        newest: store.read(FILE, Region::Data, offset, len, true),
        redundancy: store.read(FILE, Region::Redundancy, offset, len, false),
        primary: store.overflow_list(FILE, OverflowRole::Primary, offset, UNIT),
        mirror: store.overflow_list(FILE, OverflowRole::Mirror, offset, UNIT),
    }
}

fn model_of(store: &Store) -> Vec<UnitAnswers> {
    (0..UNITS)
        .map(|unit| {
            let got = answers(store, unit);
            UnitAnswers {
                base: got.base.unwrap(),
                newest: got.newest.unwrap(),
                redundancy: got.redundancy.unwrap(),
                primary: got.primary.unwrap(),
                mirror: got.mirror.unwrap(),
            }
        })
        .collect()
}

/// Whether one answer is the model's or a corrupt report; panics on anything else.
fn exact_or_corrupt<T: PartialEq + std::fmt::Debug>(
    what: &str,
    got: &Result<T, StorageError>,
    want: &T,
) -> bool {
    match got {
        Ok(value) => {
            assert!(value == want, "{what}: wrong answer served with no error");
            false
        }
        Err(StorageError::Corrupt { file, .. }) => {
            assert_eq!(*file, FILE, "{what}");
            true
        }
        Err(other) => panic!("{what}: {other} (neither the bytes nor a corrupt report)"),
    }
}

/// Units whose answers reported corruption; panics if any answer was wrong.
fn corrupt_units(store: &Store, model: &[UnitAnswers], context: &str) -> Vec<u64> {
    let mut corrupt = Vec::new();
    for unit in 0..UNITS {
        let got = answers(store, unit);
        let want = &model[unit as usize];
        let what = |name: &str| format!("{context}: unit {unit} {name}");
        let hits = [
            exact_or_corrupt(&what("base"), &got.base, &want.base),
            exact_or_corrupt(&what("newest"), &got.newest, &want.newest),
            exact_or_corrupt(&what("redundancy"), &got.redundancy, &want.redundancy),
            exact_or_corrupt(&what("primary"), &got.primary, &want.primary),
            exact_or_corrupt(&what("mirror"), &got.mirror, &want.mirror),
        ];
        if hits.contains(&true) {
            corrupt.push(unit);
        }
    }
    corrupt
}

/// The client's repair of one unit from the other copies (`rebuild_column_stripe`).
fn repair(store: &Store, unit: u64, want: &UnitAnswers) {
    let offset = unit * UNIT;
    store
        .write(FILE, Region::Data, offset, &want.base, true)
        .unwrap();
    store
        .write(FILE, Region::Redundancy, offset, &want.redundancy, false)
        .unwrap();
    store
        .overflow_invalidate(FILE, OverflowRole::Mirror, offset, UNIT)
        .unwrap();
    for (role, (extents, bytes)) in [
        (OverflowRole::Primary, &want.primary),
        (OverflowRole::Mirror, &want.mirror),
    ] {
        let mut at = 0usize;
        for extent in extents {
            let piece = &bytes[at..at + extent.len as usize];
            store
                .overflow_write(FILE, role, extent.offset, piece)
                .unwrap();
            at += extent.len as usize;
        }
    }
}

/// Repairs the `corrupt` units and checks that every answer is the model's after; the
/// context for later checks.
fn repair_all(store: &Store, model: &[UnitAnswers], corrupt: &[u64], context: &str) -> String {
    for &unit in corrupt {
        repair(store, unit, &model[unit as usize]);
    }
    let after = format!("{context}, after repairing units {corrupt:?}");
    assert!(corrupt_units(store, model, &after).is_empty(), "{after}");
    after
}

/// Every file under `root`, with its bytes.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    paths(root)
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect()
}

/// Every file under `root`.
fn paths(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

/// Puts every file back as it was (and removes any file added since).
fn restore(root: &Path, pristine: &BTreeMap<PathBuf, Vec<u8>>) {
    for path in paths(root) {
        if !pristine.contains_key(&path) {
            std::fs::remove_file(path).unwrap();
        }
    }
    for (path, bytes) in pristine {
        // Most files are unchanged: reading is much cheaper than rewriting.
        if std::fs::read(path).ok().as_ref() != Some(bytes) {
            std::fs::write(path, bytes).unwrap();
        }
    }
}

fn flip_bit(path: &Path, bit: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
    std::fs::write(path, bytes).unwrap();
}

/// What became of the damage done to one file.
#[derive(Debug, Default)]
struct Tally {
    flips: u64,
    /// `open` refused the store, naming the damaged file.
    refused: u64,
    /// Reads answered corrupt, and the rewrite made every answer exact.
    detected_repaired: u64,
    /// A record was found damaged and kept safe: an intent record's stripe kept as stale
    /// parity, or the file's record listed as damaged or missing (recovery takes another
    /// column's); every answer exact.
    record_flagged: u64,
    /// Snapshot reads were refused here (the client reconstructs them), every other answer
    /// exact.
    snapshot_refused: u64,
    /// The store found the damage at open and rewrote the file itself (the log header, a
    /// seal, a tombstone copy, the boot id, a stale-parity record).
    repaired_at_open: u64,
    /// The file was left as damaged, and every answer and record is exact: bytes no read
    /// depends on (overflow bytes of no live entry, a lock file, a seal's cut that a later
    /// sync rewrites).
    unread: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.flips += other.flips;
        self.refused += other.refused;
        self.detected_repaired += other.detected_repaired;
        self.record_flagged += other.record_flagged;
        self.snapshot_refused += other.snapshot_refused;
        self.repaired_at_open += other.repaired_at_open;
        self.unread += other.unread;
    }
}

/// Reopens a store with `path` damaged (its bytes now `damaged`, `None` if deleted) and
/// checks it: refused with an error naming the file (`refusable` says whether that is
/// allowed), or every answer and record exact or flagged, and the flagged units repaired
/// exactly (and still after another reopen). Counts the outcome in `tally`.
fn reopen_damaged(
    root: &Path,
    model: &Model,
    path: &Path,
    damaged: Option<&[u8]>,
    refusable: bool,
    context: &str,
    tally: &mut Tally,
) {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    tally.flips += 1;
    let store = match Store::open(root) {
        Ok(store) => store,
        Err(error) => {
            assert!(refusable, "{context}: open failed: {error}");
            assert!(error.to_string().contains(&name), "{context}: {error}");
            tally.refused += 1;
            return;
        }
    };
    assert_eq!(store.server_id(), Some(4), "{context}");
    let flagged = check_records(&store, &model.records, context);
    let refused = snapshot_refused(&store, &model.snapshot, context);
    let corrupt = corrupt_units(&store, &model.units, context);
    if !corrupt.is_empty() {
        let after = repair_all(&store, &model.units, &corrupt, context);
        drop(store);
        let store = Store::open(root).unwrap();
        let reopened = format!("{after} and reopening");
        assert!(
            corrupt_units(&store, &model.units, &reopened).is_empty(),
            "{reopened}"
        );
        snapshot_refused(&store, &model.snapshot, &reopened);
        tally.detected_repaired += 1;
    } else if flagged != RecordDamage::default() {
        tally.record_flagged += 1;
    } else if refused {
        tally.snapshot_refused += 1;
    } else if std::fs::read(path).ok().as_deref() != damaged {
        tally.repaired_at_open += 1;
    } else {
        tally.unread += 1;
    }
}

#[test]
fn every_flipped_bit_is_detected_and_repaired() {
    let seed = seed();
    let flips: u64 = std::env::var("TESSERA_FLIPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(FLIPS_DEFAULT);
    let mut rng = StdRng::seed_from_u64(seed);
    let (dir, model, pristine) = populated_store(&mut rng);
    let root = dir.path();
    let only: Option<Vec<String>> = std::env::var("TESSERA_FLIP_FILES")
        .ok()
        .map(|names| names.split(',').map(str::to_owned).collect());
    let chosen = |path: &Path| {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        only.as_ref().is_none_or(|only| only.contains(&name))
    };
    let candidates: Vec<&PathBuf> = pristine
        .iter()
        .filter(|(path, bytes)| !bytes.is_empty() && chosen(path))
        .map(|(path, _)| path)
        .collect();
    assert!(!candidates.is_empty(), "no file to flip bits in");
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    for trial in 0..flips {
        restore(root, &pristine);
        let path = candidates[rng.gen_range(0..candidates.len())];
        let bit = rng.gen_range(0..pristine[path].len() as u64 * 8);
        let name = file_kind(root, path);
        let context = format!("seed {seed} trial {trial}: bit {bit} of {name}");
        flip_bit(path, bit);
        let damaged = std::fs::read(path).unwrap();
        let tally = tallies.entry(name.clone()).or_default();
        let refusable = name == "store.toml";
        let unread_before = tally.unread;
        reopen_damaged(
            root,
            &model,
            path,
            Some(&damaged),
            refusable,
            &context,
            tally,
        );
        if name == "store.toml" {
            assert_eq!(tally.refused, tally.flips, "{context}: accepted");
        }
        // Only bytes no read depends on may go unnoticed: overflow bytes of no live entry,
        // a snapshot copy file's bytes and checksums of blocks never copied (its holes), and
        // the 4 padding bytes that end each 40-byte journal record (after its checksum).
        let byte = bit / 8;
        let padding = name == "snap.journal" && byte >= 8 && (byte - 8) % 40 >= 36;
        if !SPARSE.contains(&name.as_str()) && !padding {
            let unread = tally.unread - unread_before;
            assert_eq!(unread, 0, "{context}: the flip went unnoticed");
        }
    }
    let mut total = Tally::default();
    for (name, tally) in &tallies {
        eprintln!("bit_flips: {name:<15} {tally:?}");
        total.add(tally);
    }
    eprintln!("bit_flips: total           {total:?}");
    assert_eq!(total.flips, flips);
    for kind in ["intent", "stale", "record", "tombstones.0", "snap.journal"] {
        let flipped = tallies.get(kind).map_or(0, |t| t.flips);
        assert!(flips < 1000 || flipped > 0, "no bit of {kind} flipped");
    }
}

/// The name a file is tallied under: its own, or the kind of record for one named by ids
/// (`intents/3.1`, `stale/3.<token>.2-4`).
fn file_kind(root: &Path, path: &Path) -> String {
    let dir = path.parent().unwrap();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    if name == "roster" {
        let dir_name = dir.file_name().unwrap().to_string_lossy();
        return format!("{dir_name}/roster");
    }
    match dir.strip_prefix(root).unwrap().to_str().unwrap() {
        "intents" => "intent".to_owned(),
        "stale" => "stale".to_owned(),
        _ => name,
    }
}

/// A file of the store cut short (a lost tail of writes, a torn copy, a truncation to zero),
/// or deleted: every file, at every cut in a seeded set (nothing left, one byte less, and
/// random lengths). As with a flipped bit, `open` refuses naming the file, or each answer is
/// the model's bytes or a corrupt report, and repairing the corrupt units makes every answer
/// exact again; and no record is lost silently (an intent record's stripe is kept as stale
/// parity, a stale-parity record's stripes stay stale, every buried file stays buried, the
/// file's record reads exactly or is listed as damaged). A store that read a cut block as
/// never written would serve zeros with no error (it did: a checksum sidecar cut short made
/// the store cut its blocks at open; an overflow log cut at a record boundary read as a
/// shorter log, its lost entries' ranges as the base's old bytes), and one that dropped a
/// damaged intent record would trust the parity its dead writer left (it did, as torn).
#[test]
fn every_truncated_file_is_detected_and_repaired() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let (dir, model, pristine) = populated_store(&mut rng);
    let root = dir.path();
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    for (path, bytes) in &pristine {
        let name = file_kind(root, path);
        let len = bytes.len() as u64;
        let mut cuts = vec![0, len.saturating_sub(1), len / 2];
        cuts.extend((0..6).map(|_| rng.gen_range(0..len.max(1))));
        cuts.retain(|&cut| cut < len);
        for cut in cuts {
            restore(root, &pristine);
            std::fs::write(path, &bytes[..cut as usize]).unwrap();
            let context = format!("seed {seed}: {name} cut to {cut} of {len} bytes");
            let tally = tallies.entry(name.clone()).or_default();
            let damaged = Some(&bytes[..cut as usize]);
            reopen_damaged(root, &model, path, damaged, true, &context, tally);
        }
        restore(root, &pristine);
        std::fs::remove_file(path).unwrap();
        let context = format!("seed {seed}: {name} deleted");
        let tally = tallies.entry(format!("{name} (deleted)")).or_default();
        reopen_damaged(root, &model, path, None, true, &context, tally);
    }
    let mut total = Tally::default();
    for (name, tally) in &tallies {
        eprintln!("truncations: {name:<24} {tally:?}");
        total.add(tally);
    }
    eprintln!("truncations: total {total:?}");
    for kind in [
        "intent",
        "stale",
        "record",
        "tombstones.0",
        "store.toml",
        "snap.journal",
        "snap.1.data.crc",
    ] {
        assert!(tallies.contains_key(kind), "{kind} was not cut");
    }
}
