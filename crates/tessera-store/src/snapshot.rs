//! Copy-on-write snapshots of one server's share of a file (issue 17, item 5).
//!
//! # Design
//!
//! A snapshot is manager state: a name, an **epoch** (the manager's counter, increasing with
//! every snapshot taken) and the metadata of its files as they stood. Its bytes are the live
//! files' bytes, except where a write came after it: there the server copied the old bytes
//! aside first. Taking one copies nothing; the client that takes it tells each server of the
//! files (`SnapshotBegin { epoch, files }`, made durable here before the answer) and only then
//! marks it readable at the manager. From then on the server knows, per file, the newest
//! epoch begun (`begun`), so a write needs no round trip to the manager: the first write to
//! a block after epoch `begun` began copies the block's current bytes into the copy file of
//! epoch `begun` and records it in the file's journal, then overwrites; later writes find
//! the block copied at `begun` and copy nothing. The unit of copying is the store's 4 KiB
//! checksummed block (a stripe unit is a whole number of them), so a write copies exactly
//! the blocks it overwrites.
//!
//! This is the paper's per-block state machine (`high-speed-total-order-san.txt`, 1.3) with
//! the block's owner as the sequencer: only this server writes its blocks, and it does so
//! under the file's exclusive lock, so *uncopied*, *locked* (the copy under the lock) and
//! *copied* need no agreement between nodes. Several clients writing one file at once meet
//! at the server's lock, and the copy is made once.
//!
//! **Which copy a read of snapshot `E` takes.** For a block, the copy with the smallest epoch
//! `c >= E`, else the live block. The copies of a block are made in increasing epochs (an
//! epoch is begun once and `begun` only grows), and the first write after `E` began made a
//! copy tagged with the epoch begun then, which is `>= E`; so that copy holds the block as
//! it stood when `E` began, and no copy `>= E` means no write since.
//!
//! **Redundancy.** Parity and mirror units are blocks of the redundancy file and are copied
//! the same way, by the server that holds them, when a write overwrites them. So a
//! snapshot's stripe is the stripe as it stood (data and parity alike), and a degraded read
//! of a snapshot reconstructs a lost column from the snapshot's view of the others (RAID-1,
//! RAID-4, RAID-5). Data copies hold the *newest* bytes (the data file overlaid with primary
//! overflow entries), which is what a Hybrid read returns; the Hybrid overflow's mirror
//! entries are not copied, so a Hybrid snapshot is readable with every column up, and a
//! degraded read of one is refused. Making it reconstruct is not a matter of copying the
//! mirror entries too: parity covers the *base* data, and the other columns' copies hold
//! their newest bytes (base overlaid with overflow), so `parity ^ others` is not the lost
//! base wherever another column of the stripe has overflow entries. It needs base and
//! overflow entries kept apart per epoch (copies of the base, and the entries live at the
//! snapshot kept from being trimmed), a change of this format not made yet.
//!
//! **The fence: data and parity agree on which writes are in.** Each server begins a
//! snapshot at its own moment, so without more a write running meanwhile could be in it on
//! its data column (written before that server began) and not on its parity column (written
//! after that one began): the snapshot's stripe would not match its parity, and a degraded
//! read of it would reconstruct wrong bytes. Every write that changes parity of a committed
//! file is covered at its parity server from before its first byte is written until after
//! its last is answered: a read-modify-write by the parity lock (its data writes are answered
//! before the parity write that unlocks), a full-stripe write by its stale-parity record
//! (cleared once every data and parity write is answered). So a snapshot is taken in three
//! steps, each sent to every server of its files before the next (the client's `snapshot`
//! module): **fence** (`SnapshotFence`): the server stops new writes of these files from
//! starting (no lock granted or queued for anew, no stale-parity record taken; the check and
//! the taking happen under one mutex, `locks.rs`) and answers once none is in flight: no lock
//! of them held or waited for, no stale-parity record left. **Begin** (`SnapshotBegin`,
//! refused unless that fence still stands). **Release.** When the last fence has answered,
//! no write of these files is in flight on any server and none can start, and that lasts
//! until the first release, after the last begin; so every write is wholly before every
//! server's begin or wholly after it, and the snapshot's stripes match their parity. A fence
//! lapses by itself after `SNAPSHOT_FENCE_LEASE_MS` (a snapshot taker that dies does not stop
//! writes for longer), so the taker gives up unless every begin was answered within 4/5 of
//! that lease from when it sent the first fence. Writes stopped by a fence wait (a lock
//! waits within its usual bound, then `LockBusy` and the client asks again) or are refused
//! (`Fenced`: a full-stripe writer drops the records it took at other columns, whose fences
//! wait for them, and asks again). A fence that does not drain within 1.5 s (a stripe torn
//! by a dead full-stripe writer that the resolver has not made whole yet, or a writer that
//! takes that long) fails the snapshot (`WritesInFlight`; take it again). A lock whose lease
//! has run out is broken by the fence, and an intent record left then (its writer died between
//! data and parity) marks its parity span *torn* in the snapshot at the begin (the blocks
//! are copied then, for the older snapshots, whose data did not hold that writer's bytes
//! yet, and are lost for this one): a read of the snapshot never reconstructs from that
//! parity (it reads as an error with a column of that
//! stripe lost, as the live file would without its intent record). RAID-1 and Hybrid overflow
//! writes take no lock or record and are not fenced: their copies are written at once, so a
//! write running meanwhile may be in one copy and not the other; each byte of the snapshot
//! is then old or new whichever copy is read, and nothing is reconstructed from parity.
//!
//! **Crash consistency.** Per block, the order is: copy bytes written to the copy file, the
//! journal record appended, the live block overwritten, all under the file's lock. A server
//! killed before the record leaves the live block old and the block uncopied: the next write
//! redoes the copy. Killed after it, the copy is whole (written before the record), and the
//! next write finds it and does not copy the newer bytes. A torn record at the journal's end
//! (killed mid-append) fails its checksum and is dropped when the journal is replayed. No
//! fsync is added on the write path: a process crash keeps the page cache, and a machine
//! crash with writes not synced renews the whole store (`boot.rs`), while [`crate::Store::sync`]
//! makes copies and journal durable with the data they protect. A journal record damaged
//! anywhere but at the end makes the file's snapshot reads here refused as corrupt (the
//! client reconstructs them from the other columns) for the snapshots begun before the first
//! begin recorded after it, and for all of them if there is none; records a sync made durable
//! and the journal lost (its seal, `seal.rs`) refuse them all ([`Damage`] argues why). The
//! refusal is kept in the journal for good; rebuilding those copies here would need the
//! client to reconstruct each block as the snapshot held it and write it back (no such
//! request yet).
//!
//! # On-disk format (in the file's directory, so removing the file removes its copies)
//!
//! ```text
//! snap.journal          "TSSJ" + version u32 LE (SNAPSHOT_FORMAT_VERSION), then 40-byte
//!                       records: tag u8 (1 begin, 2 copy, 3 damaged: its epoch field is
//!                       the epoch reads below which are refused, 0 or u64::MAX for all),
//!                       region u8 (0 data, 1 redundancy),
//!                       kind u8 (0 bytes, 1 zeros, 2 lost, 3 torn: bytes
//!                       for older epochs, lost for its own), 5 zero bytes, epoch u64 LE,
//!                       block_first u64 LE, block_count u64 LE, crc32c u32 LE of the 32
//!                       bytes before it, 4 zero bytes
//! snap.<E>.data         blocks copied for epoch E from the data file, at their own offsets
//! snap.<E>.data.crc     their checksums, as the data file's sidecar
//! snap.<E>.redundancy   the same for the redundancy file
//! snap.<E>.redundancy.crc
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_layout::Region;
use tessera_wire::{FileId, StorageError};

use crate::disk::{Disk, FileHandle};
use crate::io::disk;
use crate::region::RegionFile;
use crate::seal::{Seal, SealDue, SealTurn};
use crate::BLOCK_BYTES;

/// Version of the snapshot journal and copy files.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;
const JOURNAL_MAGIC: &[u8; 4] = b"TSSJ";
pub(crate) const JOURNAL_NAME: &str = "snap.journal";
const HEADER_BYTES: u64 = 8;
const RECORD_BYTES: usize = 40;
const TAG_BEGIN: u8 = 1;
const TAG_COPY: u8 = 2;
const TAG_DAMAGED: u8 = 3;

/// What a block held when it was copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyKind {
    /// Its bytes are in the copy file.
    Bytes,
    /// Zeros (never written, or written with zeros): nothing stored.
    Zeros,
    /// Its bytes failed their checksum when it was copied: the snapshot's block is lost here
    /// and reads as corrupt (the client reconstructs it).
    Lost,
    /// Parity under an intent record when its epoch began (its writer died between data and
    /// parity): its bytes are in the copy file and are the block as every *older* snapshot
    /// holds it (their data did not have the dead writer's bytes yet), but for the snapshot
    /// of this very epoch they match neither the old nor the new data, so it reads as corrupt.
    Torn,
}

impl CopyKind {
    fn code(self) -> u8 {
        match self {
            CopyKind::Bytes => 0,
            CopyKind::Zeros => 1,
            CopyKind::Lost => 2,
            CopyKind::Torn => 3,
        }
    }

    fn from_code(code: u8) -> Option<CopyKind> {
        match code {
            0 => Some(CopyKind::Bytes),
            1 => Some(CopyKind::Zeros),
            2 => Some(CopyKind::Lost),
            3 => Some(CopyKind::Torn),
            _ => None,
        }
    }
}

fn region_code(region: Region) -> u8 {
    match region {
        Region::Data => 0,
        Region::Redundancy => 1,
    }
}

fn region_of(code: u8) -> Option<Region> {
    match code {
        0 => Some(Region::Data),
        1 => Some(Region::Redundancy),
        _ => None,
    }
}

/// One journal record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    Begin {
        epoch: u64,
    },
    Copy {
        region: Region,
        kind: CopyKind,
        epoch: u64,
        first: u64,
        count: u64,
    },
    /// Records of this journal were lost or damaged (kept in the journal, so that appends
    /// and rewrites never forget it): snapshot reads here of epochs below `below` are
    /// refused (0, as written before bounds were kept: every epoch; see [`Damage`]).
    Damaged {
        below: u64,
    },
}

impl Record {
    fn encode(self) -> [u8; RECORD_BYTES] {
        let mut out = [0u8; RECORD_BYTES];
        let (tag, region, kind, epoch, first, count) = match self {
            Record::Begin { epoch } => (TAG_BEGIN, 0, 0, epoch, 0, 0),
            Record::Damaged { below } => (TAG_DAMAGED, 0, 0, below, 0, 0),
            Record::Copy {
                region,
                kind,
                epoch,
                first,
                count,
            } => (
                TAG_COPY,
                region_code(region),
                kind.code(),
                epoch,
                first,
                count,
            ),
        };
        out[0] = tag;
        out[1] = region;
        out[2] = kind;
        out[8..16].copy_from_slice(&epoch.to_le_bytes());
        out[16..24].copy_from_slice(&first.to_le_bytes());
        out[24..32].copy_from_slice(&count.to_le_bytes());
        let crc = crc32c::crc32c(&out[..32]);
        out[32..36].copy_from_slice(&crc.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Record> {
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(bytes[32..36].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&bytes[..32]) {
            return None;
        }
        match bytes[0] {
            TAG_BEGIN => Some(Record::Begin { epoch: word(8) }),
            TAG_DAMAGED => Some(Record::Damaged { below: word(8) }),
            TAG_COPY => Some(Record::Copy {
                region: region_of(bytes[1])?,
                kind: CopyKind::from_code(bytes[2])?,
                epoch: word(8),
                first: word(16),
                count: word(24),
            }),
            _ => None,
        }
    }
}

/// A file handle written since the last sync, named for errors.
pub(crate) type Written = (String, FileHandle);

/// One file's snapshot state on this server: the newest epoch begun, the blocks copied and
/// their copy files.
pub(crate) struct Snapshots {
    file: FileId,
    dir: PathBuf,
    disk: Arc<dyn Disk>,
    /// The journal, once the first snapshot began.
    journal: Option<FileHandle>,
    /// Where the next record goes.
    journal_end: u64,
    /// The newest epoch begun for this file (0: none).
    begun: u64,
    /// (region code, block, epoch) -> what was copied.
    copies: BTreeMap<(u8, u64, u64), CopyKind>,
    /// The blocks of `copies` at epoch `begun`, as runs, by region code: what a write must
    /// not copy again, found with a search per run rather than one per 4 KiB block (a write
    /// over copied blocks did about 100 ns of map search per block, 10% of the store's
    /// share of an overwrite of cached blocks).
    copied_at_begun: [Runs; 2],
    /// Copy files opened, by (epoch, region code).
    files: BTreeMap<(u64, u8), RegionFile>,
    /// Which snapshot reads records lost or damaged make this server refuse.
    damage: Damage,
    /// Seal writes taken by syncs, voided by a rewrite of the journal (`seal.rs`).
    seal_turn: SealTurn,
}

/// Which snapshots of a file records lost from its journal may have been about.
///
/// A damaged record was appended when some epoch `b` was the newest begun here, and concerns
/// epochs up to `b` only. A `Begin` appended after it, *before the damage was found*, has an
/// epoch above `b` (a begin is appended only for an epoch above the newest begun, which the
/// journal then still told right). So reads of epochs from that begin's on are exact, and
/// only older snapshots stay refused here (the client reconstructs them from the other
/// columns). A begin appended after the damage was found bounds nothing: the newest epoch
/// begun may have been in the lost record, and a snapshot whose taker drew its epoch before
/// that one's can begin after it. So the bound is fixed when the damage is found, and kept
/// durably (`Damaged { below }`, appended at open); with no begin after the damage then, or
/// records lost from the tail (the seal), every snapshot read of the file stays refused, as
/// before. Before, one damaged record refused every snapshot of the file here for good, the
/// ones begun after it included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Damage {
    /// Reads of epochs below this are refused.
    below: u64,
    /// A damaged record met in the replay with no begin after it yet.
    pending: bool,
    /// A damaged record met in the replay with no `Damaged` record after it: the bound is
    /// not kept yet, so the open appends it.
    unkept: bool,
}

impl Damage {
    fn refuses(&self, epoch: u64) -> bool {
        self.pending || epoch < self.below
    }

    /// A damaged record, met replaying the journal.
    fn found(&mut self) {
        self.pending = true;
        self.unkept = true;
    }

    /// A record `Begin { epoch }`: it bounds a damaged record met before it in the replay.
    /// (At run time nothing is pending: the open kept the bound.)
    fn begun(&mut self, epoch: u64) {
        if self.pending {
            self.below = self.below.max(epoch);
            self.pending = false;
        }
    }

    /// A `Damaged` record: the bound kept when damage before it was found (0, as written
    /// before bounds were kept: every read refused). Begins after it bound nothing.
    fn recorded(&mut self, below: u64) {
        let below = if below == 0 { u64::MAX } else { below };
        self.below = self.below.max(below);
        self.pending = false;
        self.unkept = false;
    }

    /// At the end of the replay: the bound to keep, if a damaged record was met since the
    /// last kept one (every read refused if no begin came after it).
    fn settle(&mut self) -> Option<u64> {
        if self.pending {
            self.below = u64::MAX;
            self.pending = false;
        }
        std::mem::take(&mut self.unkept).then_some(self.below)
    }

    /// The record that keeps this damage in a journal rewritten whole.
    fn record(&self) -> Option<Record> {
        (self.below > 0).then_some(Record::Damaged { below: self.below })
    }
}

impl Snapshots {
    /// Loads the journal of the file in `dir`, if it has one. A torn last record is dropped.
    pub(crate) fn open(
        file: FileId,
        dir: &Path,
        on: Arc<dyn Disk>,
    ) -> Result<Snapshots, StorageError> {
        let mut snapshots = Snapshots {
            file,
            dir: dir.to_path_buf(),
            disk: on,
            journal: None,
            journal_end: HEADER_BYTES,
            begun: 0,
            copies: BTreeMap::new(),
            copied_at_begun: Default::default(),
            files: BTreeMap::new(),
            damage: Damage::default(),
            seal_turn: SealTurn::default(),
        };
        let path = dir.join(JOURNAL_NAME);
        let journal = match snapshots.disk.open_existing(&path) {
            Ok(journal) => journal,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(snapshots),
            Err(error) => return Err(disk(format_args!("open {}", path.display()), error)),
        };
        let bytes = crate::disk::read_file(&*snapshots.disk, &path)
            .map_err(|error| disk(format_args!("read {}", path.display()), error))?;
        let header_whole = bytes.len() >= HEADER_BYTES as usize
            && &bytes[..4] == JOURNAL_MAGIC
            && bytes[4..8] == SNAPSHOT_FORMAT_VERSION.to_le_bytes();
        if header_whole {
            snapshots.replay(&bytes[HEADER_BYTES as usize..]);
        } else {
            // Nothing is known of the journal (a flipped bit in its header, which has no
            // checksum, looks like another format): every snapshot read of the file is refused
            // here for good, while the live file reads and writes as before. (An unknown
            // version used to fail every request of the file, live reads included, with a
            // disk error rather than a corrupt report.)
            tracing::error!(
                "{} has a damaged header or an unknown format version: snapshot reads of file \
                 {file} are refused here",
                path.display()
            );
            snapshots.damage.recorded(u64::MAX);
        }
        snapshots.journal = Some(journal);
        // The seal first: what is appended after the replay must not hide a shorter journal.
        snapshots.check_seal()?;
        snapshots.keep_damage()?;
        Ok(snapshots)
    }

    /// Applies the journal's records. A damaged one before the last is kept where it is
    /// (appends go after it, so every later replay finds it too), and the records after it
    /// still count (the newest epoch begun among them); a torn last record is a kill
    /// mid-append, whose write never followed: the next append goes over it.
    fn replay(&mut self, records: &[u8]) {
        let whole = records.len() / RECORD_BYTES;
        for (index, bytes) in records.chunks_exact(RECORD_BYTES).enumerate() {
            match Record::decode(bytes) {
                Some(record) => self.apply(record),
                None if index + 1 < whole => {
                    self.damage.found();
                    tracing::error!(
                        "snapshot journal of file {} in {}: record {index} is damaged; \
                         snapshot reads of it are refused here",
                        self.file,
                        self.dir.display()
                    );
                }
                None => break,
            }
            self.journal_end = HEADER_BYTES + ((index + 1) * RECORD_BYTES) as u64;
        }
    }

    /// Keeps durably the bound of damage the replay found (see [`Damage`]), before anything
    /// is appended after it.
    fn keep_damage(&mut self) -> Result<(), StorageError> {
        match self.damage.settle() {
            Some(below) => self.append_synced(Record::Damaged { below }),
            None => Ok(()),
        }
    }

    /// Appends `record` and makes the journal durable.
    fn append_synced(&mut self, record: Record) -> Result<(), StorageError> {
        let path = self.dir.join(JOURNAL_NAME);
        let (_, journal) = self.append(&[record])?;
        journal
            .sync_data()
            .map_err(|error| disk(format_args!("sync {}", path.display()), error))
    }

    /// Compares the journal with its seal (`seal.rs`): if records a sync made durable are
    /// gone, snapshot reads here are refused, durably (a [`Record::Damaged`] appended and
    /// synced).
    fn check_seal(&mut self) -> Result<(), StorageError> {
        let path = self.dir.join(JOURNAL_NAME);
        if !Seal::of(&path).lost_records(&*self.disk, self.journal_end)? {
            return Ok(());
        }
        tracing::error!(
            "snapshot journal of file {} in {} is shorter than a sync left it; snapshot reads \
             of it are refused here",
            self.file,
            self.dir.display()
        );
        // Which epochs the lost records were about is unknown: every read is refused.
        self.append_synced(Record::Damaged { below: u64::MAX })
    }

    /// The seal of the journal at its length now, for a sync to write once the journal is
    /// durable (see [`SealTurn::due`]); `None` if there is no journal.
    pub(crate) fn seal(&self) -> Result<Option<(SealDue, bool)>, StorageError> {
        if self.journal.is_none() {
            return Ok(None);
        }
        let journal = self.dir.join(JOURNAL_NAME);
        (self.seal_turn)
            .due(&*self.disk, &journal, self.journal_end)
            .map(Some)
    }

    fn apply(&mut self, record: Record) {
        match record {
            Record::Begin { epoch } if epoch > self.begun => {
                self.damage.begun(epoch);
                self.begun = epoch;
                self.copied_at_begun = Default::default();
            }
            Record::Begin { epoch } => self.damage.begun(epoch),
            Record::Damaged { below } => self.damage.recorded(below),
            Record::Copy {
                region,
                kind,
                epoch,
                first,
                count,
            } => {
                let end = first.saturating_add(count);
                for block in first..end {
                    self.copies
                        .insert((region_code(region), block, epoch), kind);
                }
                if epoch == self.begun {
                    self.copied_at_begun[usize::from(region_code(region))].insert(first, end);
                }
            }
        }
    }

    /// The newest epoch begun for this file (0: none).
    pub(crate) fn begun(&self) -> u64 {
        self.begun
    }

    /// Bytes of copies kept.
    pub(crate) fn copied_bytes(&self) -> u64 {
        let blocks = self
            .copies
            .values()
            .filter(|k| matches!(k, CopyKind::Bytes | CopyKind::Torn))
            .count();
        blocks as u64 * BLOCK_BYTES
    }

    /// Appends `records` to the journal (creating it), returning it to be synced.
    fn append(&mut self, records: &[Record]) -> Result<Written, StorageError> {
        let path = self.dir.join(JOURNAL_NAME);
        let journal = match &self.journal {
            Some(journal) => Arc::clone(journal),
            None => {
                let journal = self
                    .disk
                    .create(&path)
                    .map_err(|error| disk(format_args!("create {}", path.display()), error))?;
                let mut header = [0u8; HEADER_BYTES as usize];
                header[..4].copy_from_slice(JOURNAL_MAGIC);
                header[4..].copy_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
                journal
                    .write_all_at(&header, 0)
                    .map_err(|error| disk(format_args!("write {}", path.display()), error))?;
                self.journal = Some(Arc::clone(&journal));
                self.journal_end = HEADER_BYTES;
                journal
            }
        };
        let mut bytes = Vec::with_capacity(records.len() * RECORD_BYTES);
        for record in records {
            bytes.extend_from_slice(&record.encode());
        }
        journal
            .write_all_at(&bytes, self.journal_end)
            .map_err(|error| disk(format_args!("append to {}", path.display()), error))?;
        self.journal_end += bytes.len() as u64;
        for &record in records {
            self.apply(record);
        }
        Ok((JOURNAL_NAME.to_string(), journal))
    }

    /// Records that snapshot `epoch` began: later writes copy first. Returns the journal and
    /// copy files written, which the caller makes durable before answering. An epoch at or
    /// below the newest begun changes nothing (a retry, or a snapshot taken at the same time
    /// as a newer one: its copies are the newer one's, taken at a moment within its own
    /// taking).
    ///
    /// `torn` are redundancy-file byte ranges whose parity may not match the data (spans of
    /// intent records left by writers that died): their blocks are copied now, as older
    /// snapshots hold them, and recorded [`CopyKind::Torn`], so that a read of this snapshot
    /// never reconstructs from them. (Recording them lost for this epoch alone was not
    /// enough: a read of an older snapshot takes the copy of the smallest epoch at or above
    /// its own, which was then "lost" too, and the later parity write copied nothing.)
    pub(crate) fn begin(
        &mut self,
        epoch: u64,
        torn: &[(u64, u64)],
        live: &dyn Fn(u64, usize) -> Result<Vec<u8>, StorageError>,
    ) -> Result<Vec<Written>, StorageError> {
        if epoch <= self.begun {
            return Ok(Vec::new());
        }
        let mut records = vec![Record::Begin { epoch }];
        let mut written = Vec::new();
        for &(start, end) in torn {
            let first = start / BLOCK_BYTES;
            for block in first..end.div_ceil(BLOCK_BYTES) {
                let kind = match live(block * BLOCK_BYTES, BLOCK_BYTES as usize) {
                    Ok(bytes) => {
                        let name = copy_name(epoch, Region::Redundancy);
                        let copy = self.copy_file(epoch, Region::Redundancy)?;
                        copy.write(block * BLOCK_BYTES, &bytes)?;
                        written.push((name.clone(), Arc::clone(&copy.bytes)));
                        written.push((format!("{name}.crc"), Arc::clone(&copy.crc)));
                        CopyKind::Torn
                    }
                    Err(StorageError::Corrupt { .. }) => CopyKind::Lost,
                    Err(error) => return Err(error),
                };
                records.push(Record::Copy {
                    region: Region::Redundancy,
                    kind,
                    epoch,
                    first: block,
                    count: 1,
                });
            }
        }
        // The record follows the copy's bytes, as for a write's copies.
        written.push(self.append(&records)?);
        Ok(written)
    }

    /// The copy file of `epoch` for `region`, opened (and created) on first use.
    fn copy_file(&mut self, epoch: u64, region: Region) -> Result<&mut RegionFile, StorageError> {
        let key = (epoch, region_code(region));
        if !self.files.contains_key(&key) {
            let name = copy_name(epoch, region);
            let open = |name: String| {
                let path = self.dir.join(name);
                self.disk
                    .open(&path)
                    .map_err(|error| disk(format_args!("open {}", path.display()), error))
            };
            let bytes = open(name.clone())?;
            let crc = open(format!("{name}.crc"))?;
            let opened = RegionFile::open(self.file, region, bytes, crc)?;
            self.files.insert(key, opened);
        }
        Ok(self.files.get_mut(&key).expect("just opened"))
    }

    /// Before `offset..offset+len` of `region` is overwritten: copies every block of it not
    /// yet copied since the newest snapshot began, reading its current bytes with `live`
    /// (whole blocks). Returns the files written, to be synced with the next sync.
    pub(crate) fn preserve(
        &mut self,
        region: Region,
        offset: u64,
        len: u64,
        live: &dyn Fn(u64, usize) -> Result<Vec<u8>, StorageError>,
    ) -> Result<Vec<Written>, StorageError> {
        let epoch = self.begun;
        if epoch == 0 || len == 0 {
            return Ok(Vec::new());
        }
        let first = offset / BLOCK_BYTES;
        let end = (offset + len).div_ceil(BLOCK_BYTES);
        let runs = self.copied_at_begun[usize::from(region_code(region))].gaps(first, end);
        let mut written = Vec::new();
        let mut records = Vec::new();
        for (start, end) in runs {
            let count = end - start;
            self.copy_run(
                region,
                epoch,
                start,
                count,
                live,
                &mut records,
                &mut written,
            )?;
        }
        if !records.is_empty() {
            // The record follows the copy's bytes: a kill between them redoes the copy.
            written.push(self.append(&records)?);
        }
        Ok(written)
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_run(
        &mut self,
        region: Region,
        epoch: u64,
        start: u64,
        count: u64,
        live: &dyn Fn(u64, usize) -> Result<Vec<u8>, StorageError>,
        records: &mut Vec<Record>,
        written: &mut Vec<Written>,
    ) -> Result<(), StorageError> {
        let bytes = match live(start * BLOCK_BYTES, (count * BLOCK_BYTES) as usize) {
            Ok(bytes) => bytes,
            Err(StorageError::Corrupt { .. }) if count > 1 => {
                // Find the bad blocks one by one; the others are copied.
                for block in start..start + count {
                    self.copy_run(region, epoch, block, 1, live, records, written)?;
                }
                return Ok(());
            }
            Err(StorageError::Corrupt { .. }) => {
                records.push(Record::Copy {
                    region,
                    kind: CopyKind::Lost,
                    epoch,
                    first: start,
                    count,
                });
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        if bytes.iter().all(|&byte| byte == 0) {
            records.push(Record::Copy {
                region,
                kind: CopyKind::Zeros,
                epoch,
                first: start,
                count,
            });
            return Ok(());
        }
        let name = copy_name(epoch, region);
        let copy = self.copy_file(epoch, region)?;
        copy.write(start * BLOCK_BYTES, &bytes)?;
        written.push((name.clone(), Arc::clone(&copy.bytes)));
        written.push((format!("{name}.crc"), Arc::clone(&copy.crc)));
        records.push(Record::Copy {
            region,
            kind: CopyKind::Bytes,
            epoch,
            first: start,
            count,
        });
        Ok(())
    }

    /// `len` bytes at `offset` of `region` as they stood when snapshot `epoch` began here,
    /// the live bytes read with `live`. Refused as corrupt where this server cannot tell.
    pub(crate) fn read(
        &mut self,
        region: Region,
        offset: u64,
        len: usize,
        epoch: u64,
        live: &dyn Fn(u64, usize) -> Result<Vec<u8>, StorageError>,
    ) -> Result<Vec<u8>, StorageError> {
        let file = self.file;
        let corrupt = |at: u64| StorageError::Corrupt {
            file,
            region,
            offset: at,
        };
        if self.damage.refuses(epoch) || epoch == 0 || self.begun < epoch {
            return Err(corrupt(offset));
        }
        let code = region_code(region);
        let first = offset / BLOCK_BYTES;
        let end = (offset + len as u64).div_ceil(BLOCK_BYTES);
        let mut out = Vec::with_capacity(((end - first) * BLOCK_BYTES) as usize);
        // Runs of blocks served from one place: (source epoch or 0 for live, kind, count).
        let mut runs: Vec<(u64, CopyKind, u64)> = Vec::new();
        for block in first..end {
            let source = self
                .copies
                .range((code, block, epoch)..=(code, block, u64::MAX))
                .next()
                .map(|(&(_, _, copied), &kind)| (copied, kind))
                .unwrap_or((0, CopyKind::Bytes));
            match runs.last_mut() {
                Some((e, k, count)) if (*e, *k) == source => *count += 1,
                _ => runs.push((source.0, source.1, 1)),
            }
        }
        let mut block = first;
        for (source, kind, count) in runs {
            let (at, bytes) = (block * BLOCK_BYTES, (count * BLOCK_BYTES) as usize);
            match (source, kind) {
                (_, CopyKind::Lost) => return Err(corrupt(at)),
                (copied, CopyKind::Torn) if copied == epoch => return Err(corrupt(at)),
                (_, CopyKind::Zeros) => out.resize(out.len() + bytes, 0),
                (0, _) => out.extend_from_slice(&live(at, bytes)?),
                (copied, _) => {
                    out.extend_from_slice(&self.copy_file(copied, region)?.read(at, bytes)?)
                }
            }
            block += count;
        }
        let skip = (offset - first * BLOCK_BYTES) as usize;
        Ok(out[skip..skip + len].to_vec())
    }

    /// Snapshot `dropped` was removed and `live` are the file's snapshots still kept: deletes
    /// every copy of an epoch up to `dropped` that none of them reads (the journal is
    /// rewritten without them, and a copy file left with none is deleted). Copies of later
    /// epochs are kept: a snapshot taken since may not be in `live` yet. Returns whether
    /// anything changed.
    pub(crate) fn drop_snapshot(
        &mut self,
        dropped: u64,
        live: &[u64],
    ) -> Result<bool, StorageError> {
        let mut kept = BTreeMap::new();
        let mut previous: Option<(u8, u64, u64)> = None;
        for (&(code, block, epoch), &kind) in &self.copies {
            // The copies of a block with epochs in (prev, epoch] read this one.
            let floor = match previous {
                Some((c, b, e)) if (c, b) == (code, block) => e,
                _ => 0,
            };
            previous = Some((code, block, epoch));
            if epoch > dropped || live.iter().any(|&l| floor < l && l <= epoch) {
                kept.insert((code, block, epoch), kind);
            }
        }
        if kept.len() == self.copies.len() {
            return Ok(false);
        }
        self.copies = kept;
        self.copied_at_begun = Default::default();
        for &(code, block, epoch) in self.copies.keys() {
            if epoch == self.begun {
                self.copied_at_begun[usize::from(code)].insert(block, block + 1);
            }
        }
        self.rewrite_journal()?;
        let epochs_left: std::collections::BTreeSet<(u64, u8)> = self
            .copies
            .keys()
            .map(|&(code, _, epoch)| (epoch, code))
            .collect();
        let stale: Vec<(u64, u8)> = self
            .files
            .keys()
            .copied()
            .filter(|key| !epochs_left.contains(key))
            .collect();
        for key in stale {
            self.files.remove(&key);
        }
        for name in self.disk.read_dir(&self.dir).unwrap_or_default() {
            let Some((epoch, code)) = parse_copy_name(&name) else {
                continue;
            };
            if !epochs_left.contains(&(epoch, code)) {
                let path = self.dir.join(&name);
                self.disk
                    .remove_file(&path)
                    .map_err(|error| disk(format_args!("remove {}", path.display()), error))?;
            }
        }
        Ok(true)
    }

    /// Replaces the journal by one holding the newest epoch begun and the copies kept,
    /// durably (written aside, synced, renamed over, directory synced).
    fn rewrite_journal(&mut self) -> Result<(), StorageError> {
        let mut records = vec![Record::Begin { epoch: self.begun }];
        let mut run: Option<Record> = None;
        for (&(code, block, epoch), &kind) in &self.copies {
            let region = region_of(code).expect("stored codes are valid");
            if let Some(Record::Copy {
                region: r,
                kind: k,
                epoch: e,
                first,
                count,
            }) = &mut run
            {
                if (*r, *k, *e) == (region, kind, epoch) && *first + *count == block {
                    *count += 1;
                    continue;
                }
            }
            records.extend(run.take());
            run = Some(Record::Copy {
                region,
                kind,
                epoch,
                first: block,
                count: 1,
            });
        }
        records.extend(run);
        records.extend(self.damage.record());
        let mut bytes = Vec::with_capacity(HEADER_BYTES as usize + records.len() * RECORD_BYTES);
        bytes.extend_from_slice(JOURNAL_MAGIC);
        bytes.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        for record in &records {
            bytes.extend_from_slice(&record.encode());
        }
        let path = self.dir.join(JOURNAL_NAME);
        // The seal first: a journal longer than its seal is only one not sealed again yet.
        // Its own turn, so that a sync's seal of the longer journal is not written after it.
        let seal = Seal::of(&path);
        (self.seal_turn).shorten(|| seal.write_synced(&*self.disk, bytes.len() as u64))?;
        let aside = self.dir.join(format!("{JOURNAL_NAME}.new"));
        let fail = |what: &str, error| disk(format_args!("{what} {}", aside.display()), error);
        crate::disk::write_file_synced(&*self.disk, &aside, &bytes)
            .map_err(|e| fail("write", e))?;
        self.disk
            .rename(&aside, &path)
            .map_err(|e| fail("rename", e))?;
        self.disk
            .sync_dir(&self.dir)
            .map_err(|e| fail("sync directory of", e))?;
        self.journal = Some(
            self.disk
                .open_existing(&path)
                .map_err(|error| disk(format_args!("open {}", path.display()), error))?,
        );
        self.journal_end = bytes.len() as u64;
        Ok(())
    }
}

fn copy_name(epoch: u64, region: Region) -> String {
    match region {
        Region::Data => format!("snap.{epoch}.data"),
        Region::Redundancy => format!("snap.{epoch}.redundancy"),
    }
}

/// The epoch and region code of a copy file's name (its sidecar's too).
fn parse_copy_name(name: &str) -> Option<(u64, u8)> {
    let rest = name.strip_prefix("snap.")?;
    let (epoch, what) = rest.split_once('.')?;
    let code = match what.trim_end_matches(".crc") {
        "data" => 0,
        "redundancy" => 1,
        _ => return None,
    };
    Some((epoch.parse().ok()?, code))
}

/// Disjoint runs of blocks, `start -> end` (exclusive), merged where they touch.
#[derive(Default)]
struct Runs(BTreeMap<u64, u64>);

impl Runs {
    /// Adds blocks `start..end`.
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        // The run beginning at or before `start`, if it reaches it, is merged.
        if let Some((&before, &before_end)) = self.0.range(..=start).next_back() {
            if before_end >= start {
                start = before;
                end = end.max(before_end);
            }
        }
        // So is every run beginning within `start..=end`.
        let within: Vec<(u64, u64)> = self.0.range(start..=end).map(|(&s, &e)| (s, e)).collect();
        for (run, run_end) in within {
            end = end.max(run_end);
            self.0.remove(&run);
        }
        self.0.insert(start, end);
    }

    /// The runs of `start..end` not in the set, in order.
    fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut at = start;
        let from = match self.0.range(..=start).next_back() {
            Some((&before, _)) => before,
            None => start,
        };
        for (&run, &run_end) in self.0.range(from..end) {
            if run > at {
                gaps.push((at, run));
            }
            at = at.max(run_end);
            if at >= end {
                return gaps;
            }
        }
        if at < end {
            gaps.push((at, end));
        }
        gaps
    }
}

#[cfg(test)]
mod tests {
    use super::Runs;

    /// The runs agree with a plain set of blocks, inserted in any order and overlapping.
    #[test]
    fn runs_agree_with_a_set_of_blocks() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        for _ in 0..200 {
            let (mut runs, mut blocks) = (Runs::default(), [false; 64]);
            for _ in 0..rng.gen_range(0..12) {
                let start = rng.gen_range(0..64u64);
                let end = rng.gen_range(start..=64);
                runs.insert(start, end);
                (start..end).for_each(|block| blocks[block as usize] = true);
            }
            let start = rng.gen_range(0..64u64);
            let end = rng.gen_range(start..=64);
            let mut want = Vec::new();
            for block in start..end {
                match want.last_mut() {
                    Some((_, e)) if !blocks[block as usize] && *e == block => *e += 1,
                    _ if !blocks[block as usize] => want.push((block, block + 1)),
                    _ => {}
                }
            }
            assert_eq!(
                runs.gaps(start, end),
                want,
                "{:?} in {start}..{end}",
                runs.0
            );
            let stored: Vec<(u64, u64)> = runs.0.iter().map(|(&s, &e)| (s, e)).collect();
            assert!(
                stored.windows(2).all(|w| w[0].1 < w[1].0),
                "merged: {stored:?}"
            );
        }
    }
}
