//! CSAR Hybrid overflow regions: an append-only byte file and the log of its table.
//!
//! `overflow` holds entry bytes, appended; each entry's record carries their crc32c, so every
//! live byte of it is checked when read. `overflow.log` starts with a 12-byte header
//! (`"TSOL"`, version u32 LE = 2, crc32c u32 LE of the first 8 bytes) and then holds fixed
//! 36-byte records, each with its own crc32c:
//!
//! ```text
//! 0      kind u8         1 = entry, 2 = invalidate, 3 = damaged
//! 1      role u8         0 = primary, 1 = mirror
//! 2..4   marker          "OR" (so that no single flipped bit makes a record all zeros)
//! 4..8   crc32c u32      of the entry's bytes (entry), zero (others)
//! 8..16  offset u64      in the primary column's data file
//! 16..24 len u64
//! 24..32 position u64    of the entry's bytes in `overflow` (entry), zero (others)
//! 32..36 crc32c u32      of bytes 0..32 of this record
//! ```
//!
//! Replaying the log in order rebuilds the table. Damage is told apart from a torn tail:
//! - A tail shorter than a record, and all-zero records at the end, are a torn append from a
//!   crash (nothing after the last sync was acknowledged as durable): they are cut off.
//! - Any other record that fails its checksum is **damage**: what it said is unknown, so from
//!   that point of the log every range of both roles is *damaged* ([`OverflowTable`]). Replay
//!   goes on (records have a fixed size), and each later entry or invalidation of a role
//!   clears the damage over its range, since it decides the bytes there whatever the damaged
//!   record said. Reads and listings that touch a damaged range fail with
//!   [`StorageError::Corrupt`], never bytes: the client treats it as a lost column, rebuilds
//!   the stripe from redundancy and writes it back, and those writes clear the damage. Replay
//!   reaches the same state on every open. Once no entry is live, the log is replaced (written
//!   aside, synced, renamed over) by one holding only "damaged" records for the ranges still
//!   damaged, and the byte file is emptied: the damaged record is then gone from the disk.
//! - A header that fails its checksum carries no information (the version comes from
//!   `store.toml`, and records check themselves): it is rewritten in place.
//! - A log cut at a record boundary is well formed, as a killed append leaves one, so the log
//!   is sealed (`seal.rs`: its length at each sync kept in `overflow.log.seal`). A log found
//!   shorter than its seal lost records that a sync made durable (a lost or torn write of the
//!   disk): every range of both roles is then damaged, as for a damaged record, and a
//!   "damaged" record says so in the log itself.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tessera_layout::{OverflowRole, Region};
use tessera_wire::{FileId, OverflowExtent, StorageError};

use crate::disk::{write_file_synced, Disk, DiskFile, FileHandle};
use crate::io::{disk, disk_format, read_full_at};
use crate::seal::{Seal, SealDue, SealTurn};
use crate::{FILE_BYTES_MAX, LIST_EXTENTS_MAX, REQUEST_BYTES_MAX};

/// First bytes of an overflow log.
const LOG_MAGIC: [u8; 4] = *b"TSOL";
/// Version of the overflow log's record format (2: checksummed header, record marker, damage
/// kept apart from torn tails).
const LOG_VERSION: u32 = 2;
/// Bytes of the log header: magic, version and their crc32c.
pub(crate) const LOG_HEADER_BYTES: u64 = 12;
/// Bytes 2..4 of every record.
const RECORD_MARKER: [u8; 2] = *b"OR";
/// Bytes of one log record.
pub(crate) const LOG_RECORD_BYTES: u64 = 36;
/// Largest overflow log read at replay (about 30 million records).
const LOG_BYTES_MAX: u64 = 1 << 30;

const KIND_ENTRY: u8 = 1;
const KIND_INVALIDATE: u8 = 2;
const KIND_DAMAGED: u8 = 3;

/// The bytes one entry was written with, which its checksum covers. Trimmed pieces of an
/// entry keep their origin so they can still be verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    /// Where the bytes start in the overflow file.
    pub(crate) position: u64,
    /// How many bytes were written.
    pub(crate) len: u64,
    /// Their crc32c.
    pub(crate) crc: u32,
}

/// A live overflow extent: `len` bytes covering `offset..offset+len` of the primary column's
/// data file, stored at `position` of the overflow file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) position: u64,
    /// Log order of the entry this extent is (part of); lower is older.
    pub(crate) sequence: u64,
    pub(crate) origin: Origin,
}

impl Extent {
    fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// The part of this extent inside `offset..end`, if any.
    fn clip(&self, offset: u64, end: u64) -> Option<Extent> {
        let start = self.offset.max(offset);
        let stop = self.end().min(end);
        (start < stop).then(|| Extent {
            offset: start,
            len: stop - start,
            position: self.position + (start - self.offset),
            ..*self
        })
    }
}

/// One log record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// A new entry; shadows older entries of its role where they overlap.
    Entry {
        role: OverflowRole,
        offset: u64,
        origin: Origin,
    },
    /// Entries of `role` are trimmed away from `offset..offset+len`.
    Invalidate {
        role: OverflowRole,
        offset: u64,
        len: u64,
    },
    /// What `role` holds in `offset..offset+len` is unknown (a damaged record said something
    /// about it): reads there are corrupt until an entry or invalidation covers them.
    Damaged {
        role: OverflowRole,
        offset: u64,
        len: u64,
    },
}

impl Record {
    pub(crate) fn encode(&self) -> [u8; LOG_RECORD_BYTES as usize] {
        let (kind, role, crc, offset, len, position) = match *self {
            Record::Entry {
                role,
                offset,
                origin,
            } => (
                KIND_ENTRY,
                role,
                origin.crc,
                offset,
                origin.len,
                origin.position,
            ),
            Record::Invalidate { role, offset, len } => (KIND_INVALIDATE, role, 0, offset, len, 0),
            Record::Damaged { role, offset, len } => (KIND_DAMAGED, role, 0, offset, len, 0),
        };
        let mut record = [0u8; LOG_RECORD_BYTES as usize];
        record[0] = kind;
        record[1] = match role {
            OverflowRole::Primary => 0,
            OverflowRole::Mirror => 1,
        };
        record[2..4].copy_from_slice(&RECORD_MARKER);
        record[4..8].copy_from_slice(&crc.to_le_bytes());
        record[8..16].copy_from_slice(&offset.to_le_bytes());
        record[16..24].copy_from_slice(&len.to_le_bytes());
        record[24..32].copy_from_slice(&position.to_le_bytes());
        let record_crc = crc32c::crc32c(&record[..32]);
        record[32..36].copy_from_slice(&record_crc.to_le_bytes());
        debug_assert_eq!(Record::decode(&record), Some(*self));
        record
    }

    /// Decodes a record; `None` if it fails its checksum or makes no sense.
    pub(crate) fn decode(record: &[u8]) -> Option<Record> {
        if record.len() != LOG_RECORD_BYTES as usize {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(record[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().unwrap());
        if crc32c::crc32c(&record[..32]) != u32_at(32) || record[2..4] != RECORD_MARKER {
            return None;
        }
        let role = match record[1] {
            0 => OverflowRole::Primary,
            1 => OverflowRole::Mirror,
            _ => return None,
        };
        let (offset, len) = (u64_at(8), u64_at(16));
        let end = offset.checked_add(len)?;
        if len == 0 || end > FILE_BYTES_MAX {
            return None;
        }
        match record[0] {
            KIND_ENTRY => {
                let position = u64_at(24);
                if len > u64::from(REQUEST_BYTES_MAX) || position.checked_add(len).is_none() {
                    return None;
                }
                Some(Record::Entry {
                    role,
                    offset,
                    origin: Origin {
                        position,
                        len,
                        crc: u32_at(4),
                    },
                })
            }
            KIND_INVALIDATE if u32_at(4) == 0 && u64_at(24) == 0 => {
                Some(Record::Invalidate { role, offset, len })
            }
            KIND_DAMAGED if u32_at(4) == 0 && u64_at(24) == 0 => {
                Some(Record::Damaged { role, offset, len })
            }
            _ => None,
        }
    }
}

/// The overflow table of one file: per role, live extents keyed by offset, never overlapping,
/// and the ranges a damaged log record may have changed (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct OverflowTable {
    roles: [BTreeMap<u64, Extent>; 2],
    /// Per role, damaged ranges as start -> end, disjoint.
    damaged: [BTreeMap<u64, u64>; 2],
    sequence_next: u64,
    live_bytes: u64,
}

fn role_index(role: OverflowRole) -> usize {
    match role {
        OverflowRole::Primary => 0,
        OverflowRole::Mirror => 1,
    }
}

impl OverflowTable {
    /// Applies one log record. An entry or invalidation decides its role's bytes over its
    /// range, so it clears any damage there.
    pub(crate) fn apply(&mut self, record: &Record) {
        match *record {
            Record::Entry {
                role,
                offset,
                origin,
            } => {
                self.trim(role, offset, origin.len);
                self.clear_damage(role, offset, origin.len);
                let extent = Extent {
                    offset,
                    len: origin.len,
                    position: origin.position,
                    sequence: self.sequence_next,
                    origin,
                };
                self.sequence_next += 1;
                self.live_bytes += extent.len;
                let previous = self.roles[role_index(role)].insert(offset, extent);
                assert!(
                    previous.is_none(),
                    "trimmed extents cannot start at {offset}"
                );
            }
            Record::Invalidate { role, offset, len } => {
                self.trim(role, offset, len);
                self.clear_damage(role, offset, len);
            }
            Record::Damaged { role, offset, len } => {
                self.clear_damage(role, offset, len);
                self.damaged[role_index(role)].insert(offset, offset + len);
            }
        }
    }

    /// The damaged ranges as records that rebuild them.
    fn damaged_records(&self) -> Vec<Record> {
        [OverflowRole::Primary, OverflowRole::Mirror]
            .into_iter()
            .flat_map(|role| {
                self.damaged[role_index(role)]
                    .iter()
                    .map(move |(&offset, &end)| Record::Damaged {
                        role,
                        offset,
                        len: end - offset,
                    })
            })
            .collect()
    }

    /// A record that failed its checksum: whatever it said, every range of both roles may
    /// have changed.
    pub(crate) fn damage_all(&mut self) {
        for damaged in &mut self.damaged {
            damaged.clear();
            damaged.insert(0, FILE_BYTES_MAX);
        }
    }

    /// Removes `offset..offset+len` from the damaged ranges of `role`.
    fn clear_damage(&mut self, role: OverflowRole, offset: u64, len: u64) {
        let end = offset + len;
        let damaged = &mut self.damaged[role_index(role)];
        let mut hit: Vec<(u64, u64)> = damaged
            .range(offset..end)
            .map(|(&start, &stop)| (start, stop))
            .collect();
        if let Some((&start, &stop)) = damaged.range(..offset).next_back() {
            if stop > offset {
                hit.push((start, stop));
            }
        }
        for (start, stop) in hit {
            damaged.remove(&start);
            if start < offset {
                damaged.insert(start, offset);
            }
            if stop > end {
                damaged.insert(end, stop);
            }
        }
    }

    /// Every damaged range of either role, as `(start, end)`.
    pub(crate) fn damaged_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.damaged
            .iter()
            .flat_map(|ranges| ranges.iter().map(|(&start, &end)| (start, end)))
    }

    /// The damaged ranges of `role` inside `offset..offset+len`, clipped to it, in order.
    pub(crate) fn damaged_within(
        &self,
        role: OverflowRole,
        offset: u64,
        len: u64,
    ) -> Vec<(u64, u64)> {
        let end = offset.saturating_add(len);
        let damaged = &self.damaged[role_index(role)];
        let before = damaged.range(..offset).next_back();
        before
            .into_iter()
            .chain(damaged.range(offset..end))
            .map(|(&start, &stop)| (start.max(offset), stop.min(end)))
            .filter(|(start, stop)| start < stop)
            .collect()
    }

    /// The first damaged byte of `role` in `offset..offset+len`, if any.
    pub(crate) fn damaged_at(&self, role: OverflowRole, offset: u64, len: u64) -> Option<u64> {
        let end = offset + len;
        let damaged = &self.damaged[role_index(role)];
        let before = damaged
            .range(..=offset)
            .next_back()
            .filter(|(_, &stop)| stop > offset)
            .map(|_| offset);
        before.or_else(|| damaged.range(offset..end).next().map(|(&start, _)| start))
    }

    /// Trims the extents of `role` away from `offset..offset+len`; true if any was touched.
    pub(crate) fn trim(&mut self, role: OverflowRole, offset: u64, len: u64) -> bool {
        let end = offset + len;
        let extents = &mut self.roles[role_index(role)];
        let mut hit: Vec<u64> = extents.range(offset..end).map(|(&key, _)| key).collect();
        // Extents never overlap, so at most one that starts before `offset` reaches into it.
        if let Some((&key, extent)) = extents.range(..offset).next_back() {
            if extent.end() > offset {
                hit.push(key);
            }
        }
        for key in &hit {
            let extent = extents.remove(key).expect("key was just listed");
            self.live_bytes -= extent.len;
            let left = extent.clip(extent.offset, offset);
            let right = extent.clip(end, extent.end());
            for piece in left.into_iter().chain(right) {
                self.live_bytes += piece.len;
                extents.insert(piece.offset, piece);
            }
        }
        !hit.is_empty()
    }

    /// Live extents of `role` overlapping `offset..offset+len`, unclipped, in offset order.
    pub(crate) fn overlapping(&self, role: OverflowRole, offset: u64, len: u64) -> Vec<Extent> {
        let end = offset + len;
        let extents = &self.roles[role_index(role)];
        let before = extents
            .range(..offset)
            .next_back()
            .map(|(_, extent)| *extent)
            .filter(|extent| extent.end() > offset);
        before
            .into_iter()
            .chain(extents.range(offset..end).map(|(_, extent)| *extent))
            .collect()
    }

    /// Whether no extent of either role is live.
    pub(crate) fn is_empty(&self) -> bool {
        self.roles.iter().all(BTreeMap::is_empty)
    }

    /// Sum of the lengths of live extents of both roles.
    pub(crate) fn live_bytes(&self) -> u64 {
        debug_assert_eq!(
            self.live_bytes,
            self.roles
                .iter()
                .flat_map(BTreeMap::values)
                .map(|extent| extent.len)
                .sum::<u64>()
        );
        self.live_bytes
    }
}

/// What an overflow operation changed on disk, so the store knows what to sync.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Touched {
    /// The overflow byte file was written or truncated.
    pub(crate) bytes: bool,
    /// The overflow log was written or truncated.
    pub(crate) log: bool,
}

/// What replaying a log found wrong, for the server's log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReplayDamage {
    /// The header failed its checksum and was rewritten.
    pub(crate) header_rewritten: bool,
    /// Records that failed their checksum before the tail (damage, not a torn append).
    pub(crate) records_damaged: u64,
    /// Bytes of torn tail cut off.
    pub(crate) torn_bytes: u64,
    /// The log was shorter than its seal: records a sync made durable are gone.
    pub(crate) sealed_records_lost: bool,
}

/// A file's overflow byte file and log, open, with the table they describe.
pub(crate) struct OverflowFiles {
    file: FileId,
    /// The disk the files are on, to replace the log by a shorter one.
    disk: Arc<dyn Disk>,
    /// Where the log is, to replace it by a shorter one.
    log_path: PathBuf,
    pub(crate) bytes: FileHandle,
    pub(crate) log: FileHandle,
    /// Where the next entry's bytes go.
    bytes_len: u64,
    /// Where the next record goes (0: the header is not written yet).
    log_len: u64,
    table: OverflowTable,
    /// Seal writes taken by syncs, voided by a shortening of the log (`seal.rs`).
    seal_turn: SealTurn,
}

impl OverflowFiles {
    /// Opens the overflow files and replays the log. A torn tail is cut off, a damaged header
    /// rewritten, and files whose entries are all dead (and none damaged) are emptied.
    pub(crate) fn open(
        file: FileId,
        [bytes, log]: [FileHandle; 2],
        disk: Arc<dyn Disk>,
        log_path: PathBuf,
    ) -> Result<(Self, Touched, ReplayDamage), StorageError> {
        let bytes_len = bytes
            .size()
            .map_err(|error| self::disk(format_args!("stat overflow of file {file}"), error))?;
        let (table, log_len, mut damage) = replay(file, &*log)?;
        let mut overflow = OverflowFiles {
            file,
            disk,
            log_path,
            bytes,
            log,
            bytes_len,
            log_len,
            table,
            seal_turn: SealTurn::default(),
        };
        damage.sealed_records_lost = overflow.check_seal()?;
        let mut touched = Touched {
            bytes: false,
            log: damage.header_rewritten || damage.torn_bytes > 0 || damage.sealed_records_lost,
        };
        if overflow.compactable() {
            overflow.compact()?;
            touched = Touched {
                bytes: true,
                log: true,
            };
        }
        Ok((overflow, touched, damage))
    }

    /// Compares the log with its seal (`seal.rs`): whether sealed records are gone, in which
    /// case every range is damaged, durably in the log.
    fn check_seal(&mut self) -> Result<bool, StorageError> {
        if !Seal::of(&self.log_path).lost_records(&*self.disk, self.log_len)? {
            return Ok(false);
        }
        for role in [OverflowRole::Primary, OverflowRole::Mirror] {
            self.append_record(&Record::Damaged {
                role,
                offset: 0,
                len: FILE_BYTES_MAX,
            })?;
        }
        Ok(true)
    }

    /// The seal of the log at its length now, for a sync to write once the log is durable
    /// (see [`SealTurn::due`]).
    pub(crate) fn seal(&self) -> Result<(SealDue, bool), StorageError> {
        (self.seal_turn).due(&*self.disk, &self.log_path, self.log_len)
    }

    /// Whether no entry is live and the files hold more than the damaged ranges need.
    fn compactable(&self) -> bool {
        let damaged_log_bytes = log_bytes(self.table.damaged_records().len());
        self.table.is_empty() && (self.bytes_len > 0 || self.log_len > damaged_log_bytes)
    }

    /// [`StorageError::Corrupt`] if a damaged log record may have changed `role`'s entries
    /// in `offset..offset+len`.
    fn check_damage(&self, role: OverflowRole, offset: u64, len: u64) -> Result<(), StorageError> {
        match self.table.damaged_at(role, offset, len) {
            Some(at) => Err(StorageError::Corrupt {
                file: self.file,
                region: Region::Data,
                offset: at,
            }),
            None => Ok(()),
        }
    }

    /// Appends an entry: its bytes, then its log record.
    pub(crate) fn append(
        &mut self,
        role: OverflowRole,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StorageError> {
        assert!(!data.is_empty() && data.len() as u64 <= u64::from(REQUEST_BYTES_MAX));
        let origin = Origin {
            position: self.bytes_len,
            len: data.len() as u64,
            crc: crc32c::crc32c(data),
        };
        self.bytes
            .write_all_at(data, origin.position)
            .map_err(|error| self.disk("append to overflow", error))?;
        self.bytes_len += origin.len;
        self.append_record(&Record::Entry {
            role,
            offset,
            origin,
        })
    }

    /// Repairs only the *bad* parts of `role` in `offset..offset+len` (damaged by a log
    /// record that failed its checksum, or held by an entry whose bytes fail theirs) from
    /// another copy's entries there (`entries`, their bytes back to back in `bytes`): the
    /// pieces of entries inside a bad part are appended, then the rest of each bad part is
    /// invalidated (the other copy holds no entry there). Parts that verify are left as they
    /// are: entries appended since the damage decide their bytes, and may be newer than the
    /// other copy's (a write whose copy there is still on the way). Entries go first, so that
    /// a crash between leaves a part bad, never wrong. Whether anything was logged.
    pub(crate) fn repair_damaged(
        &mut self,
        role: OverflowRole,
        offset: u64,
        len: u64,
        entries: &[OverflowExtent],
        bytes: &[u8],
    ) -> Result<Touched, StorageError> {
        let mut bad = self.table.damaged_within(role, offset, len);
        bad.extend(self.failing_extents(role, offset, len)?);
        let bad = merged(bad);
        let mut touched = Touched::default();
        let mut at = 0usize;
        let mut covered = Vec::new();
        for entry in entries {
            let entry_end = entry.offset + u64::from(entry.len);
            let entry_bytes = &bytes[at..at + entry.len as usize];
            at += entry.len as usize;
            for &(start, stop) in &bad {
                let (from, to) = (entry.offset.max(start), entry_end.min(stop));
                if from < to {
                    let skip = (from - entry.offset) as usize;
                    self.append(role, from, &entry_bytes[skip..skip + (to - from) as usize])?;
                    covered.push((from, to));
                    touched = Touched {
                        bytes: true,
                        log: true,
                    };
                }
            }
        }
        for (from, to) in uncovered(&bad, &merged(covered)) {
            let done = self.invalidate(role, from, to - from)?;
            touched.bytes |= done.bytes;
            touched.log |= done.log;
        }
        Ok(touched)
    }

    /// The parts of `role`'s live entries in `offset..offset+len` whose bytes fail their
    /// checksum.
    fn failing_extents(
        &self,
        role: OverflowRole,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, u64)>, StorageError> {
        let end = offset.saturating_add(len);
        let mut failing = Vec::new();
        for live in self.table.overlapping(role, offset, len) {
            let Some(piece) = live.clip(offset, end) else {
                continue;
            };
            let mut origin_bytes = vec![0u8; piece.origin.len as usize];
            read_full_at(&*self.bytes, &mut origin_bytes, piece.origin.position)
                .map_err(|error| self.disk("read overflow", error))?;
            if crc32c::crc32c(&origin_bytes) != piece.origin.crc {
                failing.push((piece.offset, piece.offset + piece.len));
            }
        }
        Ok(failing)
    }

    /// Trims entries of `role` away from `offset..offset+len`, logging it if anything was
    /// live there, and empties both files once no entry is live.
    pub(crate) fn invalidate(
        &mut self,
        role: OverflowRole,
        offset: u64,
        len: u64,
    ) -> Result<Touched, StorageError> {
        let idle = self.table.overlapping(role, offset, len).is_empty()
            && self.table.damaged_at(role, offset, len).is_none();
        if len == 0 || idle {
            return Ok(Touched::default());
        }
        self.append_record(&Record::Invalidate { role, offset, len })?;
        if self.compactable() {
            self.compact()?;
            return Ok(Touched {
                bytes: true,
                log: true,
            });
        }
        Ok(Touched {
            bytes: false,
            log: true,
        })
    }

    /// Whether live primary entries (or damage) cover any of `offset..offset+len` of the data
    /// file.
    pub(crate) fn overlays(&self, offset: u64, len: u64) -> bool {
        let role = OverflowRole::Primary;
        !self.table.overlapping(role, offset, len).is_empty()
            || self.table.damaged_at(role, offset, len).is_some()
    }

    /// Overlays the live primary entries onto `buf`, which holds the data file's bytes at
    /// `offset`.
    pub(crate) fn overlay(&self, offset: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        self.check_damage(OverflowRole::Primary, offset, buf.len() as u64)?;
        let end = offset + buf.len() as u64;
        let pieces: Vec<(Extent, Extent)> = self
            .table
            .overlapping(OverflowRole::Primary, offset, buf.len() as u64)
            .into_iter()
            .filter_map(|live| live.clip(offset, end).map(|piece| (live, piece)))
            .collect();
        self.read_pieces(&pieces, |index, bytes| {
            let at = (pieces[index].1.offset - offset) as usize;
            buf[at..at + bytes.len()].copy_from_slice(bytes);
        })
    }

    /// Live entries of `role` overlapping `offset..offset+len`, clipped to it, oldest first,
    /// with their bytes concatenated in the same order.
    pub(crate) fn list(
        &self,
        role: OverflowRole,
        offset: u64,
        len: u64,
    ) -> Result<(Vec<OverflowExtent>, Vec<u8>), StorageError> {
        self.check_damage(role, offset, len)?;
        let end = offset + len;
        let mut pieces: Vec<(Extent, Extent)> = self
            .table
            .overlapping(role, offset, len)
            .into_iter()
            .filter_map(|live| live.clip(offset, end).map(|piece| (live, piece)))
            .collect();
        pieces.sort_by_key(|(_, piece)| (piece.sequence, piece.offset));
        let bytes_total: u64 = pieces.iter().map(|(_, piece)| piece.len).sum();
        if pieces.len() > LIST_EXTENTS_MAX || bytes_total > u64::from(REQUEST_BYTES_MAX) {
            return Err(crate::io::bad_request(format!(
                "overflow listing of {} extents and {bytes_total} bytes is too large; \
                 list a smaller range",
                pieces.len()
            )));
        }
        let mut starts = Vec::with_capacity(pieces.len());
        let mut at = 0u64;
        for (_, piece) in &pieces {
            starts.push(at);
            at += piece.len;
        }
        let mut bytes = vec![0u8; bytes_total as usize];
        let extents = pieces
            .iter()
            .map(|(_, piece)| OverflowExtent {
                offset: piece.offset,
                len: u32::try_from(piece.len).expect("entries are at most REQUEST_BYTES_MAX"),
            })
            .collect();
        self.read_pieces(&pieces, |index, piece_bytes| {
            let at = starts[index] as usize;
            bytes[at..at + piece_bytes.len()].copy_from_slice(piece_bytes);
        })?;
        Ok((extents, bytes))
    }

    /// Live overflow bytes of both roles.
    pub(crate) fn live_bytes(&self) -> u64 {
        self.table.live_bytes()
    }

    /// `(start, end)` of the live entries of both roles overlapping `offset..offset+len`,
    /// unclipped, in no particular order, and of every damaged range of either role.
    /// Damaged ranges are included (unclipped): a read there answers corrupt until the client
    /// rewrites it, so a scrub must visit them.
    pub(crate) fn covered(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        [OverflowRole::Primary, OverflowRole::Mirror]
            .into_iter()
            .flat_map(|role| self.table.overlapping(role, offset, len))
            .map(|extent| (extent.offset, extent.end()))
            .chain(self.table.damaged_ranges())
            .collect()
    }

    /// Reads the bytes of each `(live extent, clipped piece)` and hands them to `sink` with the
    /// piece's index, verifying the checksum of the entry each came from. Pieces of one entry
    /// are served from one read of that entry.
    fn read_pieces(
        &self,
        pieces: &[(Extent, Extent)],
        mut sink: impl FnMut(usize, &[u8]),
    ) -> Result<(), StorageError> {
        let mut order: Vec<usize> = (0..pieces.len()).collect();
        order.sort_by_key(|&index| pieces[index].1.origin.position);
        let mut origin_bytes: Vec<u8> = Vec::new();
        let mut origin_loaded: Option<Origin> = None;
        for index in order {
            let (live, piece) = &pieces[index];
            if origin_loaded != Some(piece.origin) {
                let origin = piece.origin;
                origin_bytes.resize(origin.len as usize, 0);
                read_full_at(&*self.bytes, &mut origin_bytes, origin.position)
                    .map_err(|error| self.disk("read overflow", error))?;
                if crc32c::crc32c(&origin_bytes) != origin.crc {
                    return Err(StorageError::Corrupt {
                        file: self.file,
                        region: Region::Data,
                        offset: live.offset,
                    });
                }
                origin_loaded = Some(origin);
            }
            let skip = (piece.position - piece.origin.position) as usize;
            sink(index, &origin_bytes[skip..skip + piece.len as usize]);
        }
        Ok(())
    }

    /// Appends a record to the log (with the header first if the log is empty), then applies
    /// it to the table.
    fn append_record(&mut self, record: &Record) -> Result<(), StorageError> {
        let encoded = record.encode();
        let mut write = Vec::with_capacity((LOG_HEADER_BYTES + LOG_RECORD_BYTES) as usize);
        if self.log_len == 0 {
            write.extend_from_slice(&log_header());
        }
        write.extend_from_slice(&encoded);
        self.log
            .write_all_at(&write, self.log_len)
            .map_err(|error| self.disk("append to overflow log", error))?;
        self.log_len += write.len() as u64;
        self.table.apply(record);
        Ok(())
    }

    /// Empties both files, or (if some ranges are damaged) replaces the log by one holding only
    /// the damaged ranges and empties the byte file; only valid when no entry is live. The log
    /// goes first, so a crash in between leaves no record pointing at missing bytes.
    fn compact(&mut self) -> Result<(), StorageError> {
        assert!(self.table.is_empty());
        let damaged = self.table.damaged_records();
        // The seal first: a log longer than its seal is only one not sealed again yet. Its
        // own turn, so that a sync's seal of the longer log is not written after it.
        let seal = Seal::of(&self.log_path);
        (self.seal_turn).shorten(|| seal.write_synced(&*self.disk, log_bytes(damaged.len())))?;
        if damaged.is_empty() {
            // Durably, before the bytes go: the log's records must never outlive them.
            self.log
                .set_len(0)
                .and_then(|()| self.log.sync_data())
                .map_err(|error| self.disk("truncate overflow log", error))?;
            self.log_len = 0;
        } else {
            self.replace_log(&damaged)?;
        }
        self.bytes
            .set_len(0)
            .map_err(|error| self.disk("truncate overflow", error))?;
        self.bytes_len = 0;
        let mut table = OverflowTable::default();
        for record in &damaged {
            table.apply(record);
        }
        self.table = table;
        Ok(())
    }

    /// Writes a log of `records` aside, syncs it, renames it over the log and syncs the
    /// directory, so a crash leaves the old log or the new one, never neither.
    fn replace_log(&mut self, records: &[Record]) -> Result<(), StorageError> {
        let mut bytes = log_header().to_vec();
        for record in records {
            bytes.extend_from_slice(&record.encode());
        }
        let aside = self.log_path.with_extension("log.new");
        let fail = |what: &str, error| disk(format_args!("{what} {}", aside.display()), error);
        let new =
            write_file_synced(&*self.disk, &aside, &bytes).map_err(|error| fail("write", error))?;
        self.disk
            .rename(&aside, &self.log_path)
            .map_err(|error| fail("rename", error))?;
        let dir = self
            .log_path
            .parent()
            .expect("a log is in a file's directory");
        crate::meta::sync_dir(&*self.disk, dir)?;
        self.log = new;
        self.log_len = bytes.len() as u64;
        Ok(())
    }

    fn disk(&self, what: &str, error: std::io::Error) -> StorageError {
        disk(format_args!("{what} of file {}", self.file), error)
    }
}

/// Bytes of a log of `records` records (an empty log has no header either).
fn log_bytes(records: usize) -> u64 {
    match records as u64 {
        0 => 0,
        records => LOG_HEADER_BYTES + records * LOG_RECORD_BYTES,
    }
}

fn log_header() -> [u8; LOG_HEADER_BYTES as usize] {
    let mut header = [0u8; LOG_HEADER_BYTES as usize];
    header[..4].copy_from_slice(&LOG_MAGIC);
    header[4..8].copy_from_slice(&LOG_VERSION.to_le_bytes());
    let crc = crc32c::crc32c(&header[..8]);
    header[8..].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Where a log whose first `sealed` bytes a sync made durable stops being trustworthy after
/// a power loss: at its first damaged record (or damaged header) past `sealed`, if any. A
/// record torn by the power loss was never made durable, and neither was anything appended
/// after it (a sync makes the whole log durable, never a later part alone); damage before
/// `sealed` is not a tear and is left for replay to report.
pub(crate) fn first_torn_past(
    log: &dyn DiskFile,
    sealed: u64,
) -> Result<Option<u64>, StorageError> {
    let len = log
        .size()
        .map_err(|error| disk("stat an overflow log", error))?;
    if len <= sealed || len > LOG_BYTES_MAX {
        return Ok(None);
    }
    let mut bytes = vec![0u8; len as usize];
    read_full_at(log, &mut bytes, 0).map_err(|error| disk("read an overflow log", error))?;
    if len < LOG_HEADER_BYTES || bytes[..LOG_HEADER_BYTES as usize] != log_header() {
        return Ok((sealed < LOG_HEADER_BYTES).then_some(0));
    }
    let mut at = LOG_HEADER_BYTES;
    while at + LOG_RECORD_BYTES <= len {
        let record = &bytes[at as usize..(at + LOG_RECORD_BYTES) as usize];
        if at + LOG_RECORD_BYTES > sealed && Record::decode(record).is_none() {
            return Ok(Some(at.max(sealed)));
        }
        at += LOG_RECORD_BYTES;
    }
    Ok(None)
}

/// Replays a log: the table, the length of the valid prefix, and what was found wrong (and
/// put right on disk: a torn tail cut, a damaged header rewritten).
fn replay(
    file: FileId,
    log: &dyn DiskFile,
) -> Result<(OverflowTable, u64, ReplayDamage), StorageError> {
    let context = |what: &str| format!("{what} overflow log of file {file}");
    let len = log.size().map_err(|error| disk(context("stat"), error))?;
    let mut table = OverflowTable::default();
    let mut damage = ReplayDamage::default();
    if len == 0 {
        return Ok((table, 0, damage));
    }
    if len > LOG_BYTES_MAX {
        return Err(disk_format(format!(
            "overflow log of file {file} is {len} bytes, more than the {LOG_BYTES_MAX} \
             this build replays"
        )));
    }
    let mut bytes = vec![0u8; len as usize];
    read_full_at(log, &mut bytes, 0).map_err(|error| disk(context("read"), error))?;
    // A header cut short: the first append was torn, and nothing follows it.
    let mut valid = 0u64;
    if len >= LOG_HEADER_BYTES {
        if bytes[..LOG_HEADER_BYTES as usize] != log_header() {
            log.write_all_at(&log_header(), 0)
                .map_err(|error| disk(context("rewrite the header of"), error))?;
            damage.header_rewritten = true;
        }
        let records = &bytes[LOG_HEADER_BYTES as usize..];
        let whole = torn_tail_start(records) / LOG_RECORD_BYTES as usize;
        for record in records.chunks_exact(LOG_RECORD_BYTES as usize).take(whole) {
            match Record::decode(record) {
                Some(record) => table.apply(&record),
                None => {
                    table.damage_all();
                    damage.records_damaged += 1;
                }
            }
        }
        valid = LOG_HEADER_BYTES + (whole as u64) * LOG_RECORD_BYTES;
    }
    if valid < len {
        log.set_len(valid)
            .map_err(|error| disk(context("truncate torn tail of"), error))?;
        damage.torn_bytes = len - valid;
    }
    Ok((table, valid, damage))
}

/// Where the torn tail of the records starts: after the last whole record that is not all
/// zeros. A crash mid-append leaves a record cut short or not yet filled in; a flipped bit
/// leaves neither (a record's marker and checksums are never all zeros).
fn torn_tail_start(records: &[u8]) -> usize {
    let kept = records
        .chunks_exact(LOG_RECORD_BYTES as usize)
        .rposition(|record| record.iter().any(|&byte| byte != 0))
        .map_or(0, |last| last + 1);
    kept * LOG_RECORD_BYTES as usize
}

/// Ranges as `(start, end)`, sorted and with overlapping or touching ones joined.
fn merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match out.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

/// The parts of `ranges` that `covered` (both merged) leaves out.
fn uncovered(ranges: &[(u64, u64)], covered: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(start, end) in ranges {
        let mut at = start;
        for &(from, to) in covered {
            if to <= at || from >= end {
                continue;
            }
            if from > at {
                out.push((at, from));
            }
            at = at.max(to);
        }
        if at < end {
            out.push((at, end));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(position: u64, len: u64) -> Origin {
        Origin {
            position,
            len,
            crc: 7,
        }
    }

    fn spans(table: &OverflowTable, role: OverflowRole) -> Vec<(u64, u64, u64)> {
        table
            .overlapping(role, 0, FILE_BYTES_MAX)
            .iter()
            .map(|extent| (extent.offset, extent.len, extent.position))
            .collect()
    }

    #[test]
    fn record_encoding_round_trips_and_rejects_damage() {
        let records = [
            Record::Entry {
                role: OverflowRole::Mirror,
                offset: 12345,
                origin: Origin {
                    position: 999,
                    len: 4096,
                    crc: 0xdead_beef,
                },
            },
            Record::Invalidate {
                role: OverflowRole::Primary,
                offset: 0,
                len: FILE_BYTES_MAX,
            },
            Record::Damaged {
                role: OverflowRole::Mirror,
                offset: 100,
                len: FILE_BYTES_MAX - 100,
            },
        ];
        for record in records {
            let encoded = record.encode();
            assert_eq!(Record::decode(&encoded), Some(record));
            for byte in 0..encoded.len() {
                let mut damaged = encoded;
                damaged[byte] ^= 0x10;
                assert_eq!(Record::decode(&damaged), None, "flip in byte {byte}");
            }
            assert_eq!(Record::decode(&encoded[..35]), None);
        }
    }

    #[test]
    fn newer_entry_trims_what_it_shadows_and_splits_in_the_middle() {
        let mut table = OverflowTable::default();
        table.apply(&Record::Entry {
            role: OverflowRole::Primary,
            offset: 100,
            origin: origin(0, 100),
        });
        table.apply(&Record::Entry {
            role: OverflowRole::Primary,
            offset: 120,
            origin: origin(100, 10),
        });
        assert_eq!(
            spans(&table, OverflowRole::Primary),
            vec![(100, 20, 0), (120, 10, 100), (130, 70, 30)]
        );
        assert_eq!(table.live_bytes(), 100);
        assert!(spans(&table, OverflowRole::Mirror).is_empty());

        assert!(table.trim(OverflowRole::Primary, 90, 35));
        assert_eq!(
            spans(&table, OverflowRole::Primary),
            vec![(125, 5, 105), (130, 70, 30)]
        );
        assert!(!table.trim(OverflowRole::Primary, 0, 125));
        assert!(table.trim(OverflowRole::Primary, 0, 1000));
        assert!(table.is_empty());
        assert_eq!(table.live_bytes(), 0);
    }
}
