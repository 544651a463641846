//! Tombstones: the ids of files the manager removed and this store deleted, so that a write
//! arriving later (from a writer stalled past its pending file's lease, or still holding a
//! removed file open) is refused instead of making the file again, unreachable and never
//! removed (no file in the namespace would own its bytes, and the manager has forgotten it).
//!
//! # Why tombstones, and why here
//! A server learns of a file from its first write and forgets a removed one with its bytes,
//! so without a record it cannot tell a late write from a first one. The alternatives were a
//! check with the manager whenever a write would create a file (a round trip on every new
//! file's first write at each server, and a write racing the check could still land after the
//! removal) or a fencing token in every write (a wire change on the data path). A tombstone
//! is checked under the file's own lock, in the one place a file is created
//! ([`crate::Store`]'s `make_present`), and removal inserts it before it takes that lock: a
//! write that created the file first is deleted with it, one that comes after is refused.
//! File ids are never reused (the manager's `file_id_next` only grows), so a tombstone is
//! never wrong. Only the manager's word makes one ([`crate::Store::bury`], from the list of
//! orphans a server asks for): a client's `Remove` deletes bytes but buries nothing, so a
//! client cannot fence off a file id that is still to be created.
//!
//! # Bound
//! Ids are kept as disjoint ranges, and removals of neighbouring ids merge (ids are handed
//! out in order, and a server holds a column of most files of a small cluster), so the set
//! grows with the live files between removed ones, not with the removals. Past
//! [`TOMBSTONE_RANGES_MAX`] ranges the lowest (oldest) are forgotten: a write to one of those
//! files from a writer stalled through that many interleaved removals would leave its bytes
//! again, as before tombstones. Nothing is ever refused wrongly.
//!
//! # On disk
//! Two copies, `tombstones.0` and `tombstones.1`, each written whole and synced in turn:
//!
//! ```text
//! "TSTB" | version u32 LE | sequence u64 LE | count u32 LE | count × (first u64 LE, last u64 LE)
//!        | crc32c u32 LE of everything before it
//! ```
//!
//! At open the valid copy with the higher sequence wins. A crash while one copy is written
//! leaves the other whole (the tombstones being added were not yet acknowledged to the
//! manager, which lists them again); a flipped bit in one copy is found by its checksum, the
//! other is used and both are rewritten. If both copies fail their checksums the store opens
//! with no tombstones and says so in the log: the fence is lost for the ids buried before
//! (late writes could leave bytes again), while no byte of a live file is touched.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_wire::{FileId, StorageError};

use crate::disk::{read_file, write_file_synced, Disk};
use crate::io::disk as disk_error;

/// Most disjoint ranges of removed ids kept (16 bytes each on disk: 1 MiB per copy).
pub const TOMBSTONE_RANGES_MAX: usize = 1 << 16;

/// Version of the tombstone files' format.
pub const TOMBSTONE_FORMAT_VERSION: u32 = 1;

const MAGIC: &[u8; 4] = b"TSTB";
const HEADER_BYTES: usize = 4 + 4 + 8 + 4;
const RANGE_BYTES: usize = 16;
const COPIES: [&str; 2] = ["tombstones.0", "tombstones.1"];

/// The ids of removed files, as disjoint, non-adjacent ranges `first..=last` keyed by `first`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct IdRanges {
    ranges: BTreeMap<FileId, FileId>,
}

impl IdRanges {
    /// Whether `id` is in the set.
    pub(crate) fn contains(&self, id: FileId) -> bool {
        self.ranges
            .range(..=id)
            .next_back()
            .is_some_and(|(_, &last)| last >= id)
    }

    /// Adds `id`, merging it with the ranges it touches; false if it was in already.
    pub(crate) fn insert(&mut self, id: FileId) -> bool {
        if self.contains(id) {
            return false;
        }
        let mut first = id;
        let mut last = id;
        if let Some((&below, &below_last)) = self.ranges.range(..id).next_back() {
            if below_last.checked_add(1) == Some(id) {
                first = below;
                self.ranges.remove(&below);
            }
        }
        if let Some(above) = id.checked_add(1) {
            if let Some(above_last) = self.ranges.remove(&above) {
                last = above_last;
            }
        }
        self.ranges.insert(first, last);
        while self.ranges.len() > TOMBSTONE_RANGES_MAX {
            self.ranges.pop_first();
        }
        true
    }

    /// Number of disjoint ranges.
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }

    fn encode(&self, sequence: u64) -> Vec<u8> {
        let count = u32::try_from(self.ranges.len()).expect("bounded by TOMBSTONE_RANGES_MAX");
        let mut bytes = Vec::with_capacity(HEADER_BYTES + self.ranges.len() * RANGE_BYTES + 4);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&TOMBSTONE_FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&sequence.to_le_bytes());
        bytes.extend_from_slice(&count.to_le_bytes());
        for (&first, &last) in &self.ranges {
            bytes.extend_from_slice(&first.to_le_bytes());
            bytes.extend_from_slice(&last.to_le_bytes());
        }
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// The sequence and set a copy holds, if it is whole: right length, checksum, magic,
    /// version, and ranges in order, disjoint and not adjacent (as `encode` writes them, so
    /// that one set has exactly one encoding).
    fn decode(bytes: &[u8]) -> Option<(u64, IdRanges)> {
        let (body, crc) = bytes.split_last_chunk::<4>()?;
        if crc32c::crc32c(body) != u32::from_le_bytes(*crc) || body.len() < HEADER_BYTES {
            return None;
        }
        let word = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        if &body[..4] != MAGIC || word(4) != TOMBSTONE_FORMAT_VERSION {
            return None;
        }
        let sequence = long(8);
        let count = word(16) as usize;
        if count > TOMBSTONE_RANGES_MAX || body.len() != HEADER_BYTES + count * RANGE_BYTES {
            return None;
        }
        let mut set = IdRanges::default();
        let mut last_before: Option<u64> = None;
        for index in 0..count {
            let at = HEADER_BYTES + index * RANGE_BYTES;
            let (first, last) = (long(at), long(at + 8));
            if first > last || last_before.is_some_and(|before| first <= before.saturating_add(1)) {
                return None;
            }
            set.ranges.insert(first, last);
            last_before = Some(last);
        }
        Some((sequence, set))
    }
}

/// The store's tombstones, in memory and in their two files.
pub(crate) struct Tombstones {
    disk: Arc<dyn Disk>,
    root: PathBuf,
    set: IdRanges,
    sequence: u64,
    /// Whether both copies' names are known durable in the root directory.
    named: bool,
}

/// What a copy on disk turned out to be.
enum Copy {
    Missing,
    Damaged,
    Whole(u64, IdRanges),
}

impl Tombstones {
    /// Loads the tombstones under `root` (none in a new store), repairing a damaged or
    /// older copy from the other.
    pub(crate) fn open(disk: &Arc<dyn Disk>, root: &Path) -> Result<Tombstones, StorageError> {
        let mut copies = Vec::with_capacity(COPIES.len());
        for name in COPIES {
            let path = root.join(name);
            copies.push(match read_file(&**disk, &path) {
                Ok(bytes) => match IdRanges::decode(&bytes) {
                    Some((sequence, set)) => Copy::Whole(sequence, set),
                    None => Copy::Damaged,
                },
                Err(error) if error.kind() == ErrorKind::NotFound => Copy::Missing,
                Err(error) => {
                    return Err(disk_error(format_args!("read {}", path.display()), error))
                }
            });
        }
        let damaged = copies.iter().filter(|c| matches!(c, Copy::Damaged)).count();
        let newest = copies
            .iter()
            .filter_map(|copy| match copy {
                Copy::Whole(sequence, set) => Some((*sequence, set)),
                _ => None,
            })
            .max_by_key(|(sequence, _)| *sequence);
        let in_step =
            matches!(&copies[..], [Copy::Whole(a, x), Copy::Whole(b, y)] if a == b && x == y);
        let mut tombstones = Tombstones {
            disk: Arc::clone(disk),
            root: root.to_path_buf(),
            set: newest.map(|(_, set)| set.clone()).unwrap_or_default(),
            sequence: newest.map_or(0, |(sequence, _)| sequence),
            named: in_step,
        };
        if damaged == COPIES.len() {
            tracing::error!(
                "both tombstone files under {} fail their checksums: the store goes on without \
                 them; writes from writers stalled past a removal may leave bytes again",
                root.display()
            );
        } else if damaged > 0 {
            tracing::warn!(
                "a tombstone file under {} fails its checksum: repaired from the other copy",
                root.display()
            );
        }
        let any_on_disk = copies.iter().any(|c| !matches!(c, Copy::Missing));
        if any_on_disk && !in_step {
            tombstones.save()?;
        }
        Ok(tombstones)
    }

    /// Whether `file` was buried here.
    pub(crate) fn contains(&self, file: FileId) -> bool {
        self.set.contains(file)
    }

    /// Adds `files` in memory; true if any was new (then [`Tombstones::save`] them).
    pub(crate) fn insert(&mut self, files: &[FileId]) -> bool {
        let mut added = false;
        for &file in files {
            added |= self.set.insert(file);
        }
        added
    }

    /// Number of disjoint ranges kept.
    pub(crate) fn ranges(&self) -> usize {
        self.set.len()
    }

    /// Writes both copies, one after the other, each synced before the next is touched.
    pub(crate) fn save(&mut self) -> Result<(), StorageError> {
        self.sequence += 1;
        let bytes = self.set.encode(self.sequence);
        for name in COPIES {
            let path = self.root.join(name);
            write_file_synced(&*self.disk, &path, &bytes)
                .map_err(|error| disk_error(format_args!("write {}", path.display()), error))?;
        }
        if !self.named {
            crate::meta::sync_dir(&*self.disk, &self.root)?;
            self.named = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn neighbours_merge_and_the_lowest_ranges_go_past_the_bound() {
        let mut set = IdRanges::default();
        assert!(set.insert(5));
        assert!(set.insert(7));
        assert_eq!(set.len(), 2);
        assert!(set.insert(6));
        assert!(!set.insert(6));
        assert_eq!(set.len(), 1);
        assert!(set.contains(5) && set.contains(7) && !set.contains(4) && !set.contains(8));
        assert!(set.insert(u64::MAX) && set.insert(u64::MAX - 1));
        assert!(set.contains(u64::MAX) && !set.contains(u64::MAX - 2));
        assert!(set.insert(0) && set.contains(0) && !set.contains(1));

        let mut many = IdRanges::default();
        for id in 0..(TOMBSTONE_RANGES_MAX as u64 + 3) {
            many.insert(id * 2);
        }
        assert_eq!(many.len(), TOMBSTONE_RANGES_MAX);
        assert!(!many.contains(0) && !many.contains(4) && many.contains(6));
    }

    proptest! {
        /// The set holds exactly the ids inserted (within the bound), and decode inverts
        /// encode; any one flipped bit of an encoding is refused.
        #[test]
        fn ranges_hold_what_was_inserted_and_round_trip(
            ids in proptest::collection::vec(0u64..64, 0..40),
            sequence: u64,
            flip in any::<proptest::sample::Index>(),
        ) {
            let mut set = IdRanges::default();
            for &id in &ids {
                set.insert(id);
            }
            for id in 0..70 {
                prop_assert_eq!(set.contains(id), ids.contains(&id));
            }
            let bytes = set.encode(sequence);
            prop_assert_eq!(IdRanges::decode(&bytes), Some((sequence, set)));
            let mut flipped = bytes.clone();
            let bit = flip.index(flipped.len() * 8);
            flipped[bit / 8] ^= 1 << (bit % 8);
            prop_assert_eq!(IdRanges::decode(&flipped), None);
        }
    }
}
