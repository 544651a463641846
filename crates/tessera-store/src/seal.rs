//! Seals of append-only logs: the log's length at its last sync, kept beside it.
//!
//! A log cut at a record boundary (a lost or torn write of the disk, a bad copy) is a
//! well-formed shorter log, just as a process killed mid-append leaves one, so the log alone
//! cannot tell records a sync made durable (acknowledged) from records never synced. Each
//! sync that makes a log durable therefore writes the log's length to `<log>.seal` (length
//! u64 LE, crc32c u32 LE of it) once the log is synced, and syncs it; anything that shortens
//! the log writes the new length first, durably.
//!
//! The seal is *written* only after the log's `fdatasync`, not only synced after it: a seal
//! written before could reach the disk first (the kernel writes pages back in any order), and
//! a power loss then left a seal longer than the records that made it, so the log looked as
//! if it had lost synced records and every entry after the hole read as corrupt, synced ones
//! too (found in session 28 by a power loss at each step of an overflow repair). The length
//! is taken under the file's lock when the sync starts and written later, outside it
//! ([`SealTurn`]): a shortening of the log, or the log's state being dropped, in between
//! voids that write. A log found shorter than its seal lost synced
//! records; a longer one only has records not sealed yet. A missing seal (a log never synced)
//! or a damaged one tells nothing. The overflow log (`overflow.rs`) and the snapshot journal
//! (`snapshot.rs`) are sealed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tessera_wire::StorageError;

use crate::disk::{read_file, write_file_synced, Disk, FileHandle};
use crate::io::disk;

/// A log's turns at its seal: the seal writes that syncs took, and the shortenings of the
/// log (and the drop of its state) that void them. One per open log.
#[derive(Debug, Default)]
pub(crate) struct SealTurn(Arc<Mutex<u64>>);

impl SealTurn {
    /// A seal of `len` for the log at `log`, to write once the log is synced (taken under the
    /// file's lock, where `len` is the log's length); `created` says whether the seal file is
    /// new, so that its directory is synced too.
    pub(crate) fn due(
        &self,
        on: &dyn Disk,
        log: &Path,
        len: u64,
    ) -> Result<(SealDue, bool), StorageError> {
        let seal = Seal::of(log);
        let created = (on.kind(&seal.path))
            .map_err(|e| seal.error("stat", e))?
            .is_none();
        let taken = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let turn = Arc::clone(&self.0);
        Ok((
            SealDue {
                seal,
                len,
                turn,
                taken,
            },
            created,
        ))
    }

    /// Runs `shorten` (which writes the shorter log's seal durably, then shortens it) as a
    /// turn of its own: a seal write taken before it, and not made yet, is void.
    pub(crate) fn shorten<T>(&self, shorten: impl FnOnce() -> T) -> T {
        let mut turn = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *turn += 1;
        shorten()
    }
}

impl Drop for SealTurn {
    /// The log's state is dropped (the file removed, or forgotten to be loaded again): a seal
    /// write taken before must not land on what is there next.
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) += 1;
    }
}

/// A seal a sync writes once the log is durable ([`SealTurn::due`]).
#[derive(Debug)]
pub(crate) struct SealDue {
    seal: Seal,
    len: u64,
    turn: Arc<Mutex<u64>>,
    taken: u64,
}

impl SealDue {
    /// Writes the seal (not synced: the caller syncs the returned handle), unless the log was
    /// shortened or its state dropped since the length was taken (`None`: nothing to seal).
    pub(crate) fn write(&self, on: &dyn Disk) -> Result<Option<FileHandle>, StorageError> {
        let turn = self.turn.lock().unwrap_or_else(PoisonError::into_inner);
        if *turn != self.taken {
            return Ok(None);
        }
        let file = match on.open(&self.seal.path) {
            Ok(file) => file,
            // The file's directory is gone (removed since): nothing to seal.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(self.seal.error("open", error)),
        };
        (file.write_all_at(&encode(self.len), 0)).map_err(|e| self.seal.error("write", e))?;
        drop(turn);
        Ok(Some(file))
    }
}

/// Bytes of a seal.
const SEAL_BYTES: usize = 12;

/// What a seal says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sealed {
    /// No seal: the log was never synced (or the seal's name never became durable).
    Missing,
    /// The seal fails its checksum: it tells nothing.
    Damaged,
    /// The log's length at its last sync.
    Length(u64),
}

/// The seal of the log at `log`.
#[derive(Debug)]
pub(crate) struct Seal {
    path: PathBuf,
}

impl Seal {
    /// The seal of the log at `log` (`<log>.seal`).
    pub(crate) fn of(log: &Path) -> Seal {
        let mut name = log.file_name().expect("a log has a name").to_os_string();
        name.push(".seal");
        Seal {
            path: log.with_file_name(name),
        }
    }

    /// What the seal says.
    pub(crate) fn read(&self, on: &dyn Disk) -> Result<Sealed, StorageError> {
        match read_file(on, &self.path) {
            Ok(bytes) => Ok(decode(&bytes).map_or(Sealed::Damaged, Sealed::Length)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Sealed::Missing),
            Err(error) => Err(self.error("read", error)),
        }
    }

    /// Whether a log of `len` bytes lost records its seal says a sync made durable. A damaged
    /// seal is written again with `len` (logged).
    pub(crate) fn lost_records(&self, on: &dyn Disk, len: u64) -> Result<bool, StorageError> {
        match self.read(on)? {
            Sealed::Missing => Ok(false),
            Sealed::Length(sealed) => Ok(len < sealed),
            Sealed::Damaged => {
                tracing::warn!("{} is damaged: written again", self.path.display());
                self.write_synced(on, len)?;
                Ok(false)
            }
        }
    }

    /// Writes `len` and makes it durable (before a log is shortened to `len`).
    pub(crate) fn write_synced(&self, on: &dyn Disk, len: u64) -> Result<(), StorageError> {
        write_file_synced(on, &self.path, &encode(len)).map_err(|e| self.error("write", e))?;
        Ok(())
    }

    fn error(&self, what: &str, error: std::io::Error) -> StorageError {
        disk(format_args!("{what} {}", self.path.display()), error)
    }
}

/// A u64 LE and its crc32c: a seal's bytes (and a cut mark's, `region.rs`).
pub(crate) fn encode(len: u64) -> [u8; SEAL_BYTES] {
    let mut seal = [0u8; SEAL_BYTES];
    seal[..8].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&seal[..8]);
    seal[8..].copy_from_slice(&crc.to_le_bytes());
    seal
}

/// The u64 [`encode`] wrote, if `bytes` are whole and pass their checksum.
pub(crate) fn decode(bytes: &[u8]) -> Option<u64> {
    let bytes: &[u8; SEAL_BYTES] = bytes.try_into().ok()?;
    let crc = u32::from_le_bytes(bytes[8..].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    (crc32c::crc32c(&bytes[..8]) == crc).then_some(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDisk;

    /// A seal taken when a sync starts is written once the log is synced, unless the log was
    /// shortened (its own seal written) or its state dropped in between.
    #[test]
    fn a_seal_taken_before_a_shortening_or_a_drop_is_not_written() {
        let disk = MemDisk::new();
        disk.create_dir_all(Path::new("/f")).unwrap();
        let log = Path::new("/f/overflow.log");
        let sealed = |disk: &MemDisk| Seal::of(log).read(disk).unwrap();
        let turn = SealTurn::default();
        let (due, created) = turn.due(&disk, log, 156).unwrap();
        assert!(created);
        assert_eq!(sealed(&disk), Sealed::Missing, "taken, not written");
        assert!(due.write(&disk).unwrap().is_some());
        assert_eq!(sealed(&disk), Sealed::Length(156));
        let (due, created) = turn.due(&disk, log, 192).unwrap();
        assert!(!created);
        turn.shorten(|| Seal::of(log).write_synced(&disk, 12))
            .unwrap();
        assert!(due.write(&disk).unwrap().is_none());
        assert_eq!(
            sealed(&disk),
            Sealed::Length(12),
            "the shorter log's seal stays"
        );
        let (due, _) = turn.due(&disk, log, 48).unwrap();
        drop(turn);
        assert!(due.write(&disk).unwrap().is_none());
        assert_eq!(sealed(&disk), Sealed::Length(12));
        let alive = SealTurn::default();
        let (due, _) = alive
            .due(&disk, Path::new("/gone/overflow.log"), 48)
            .unwrap();
        assert!(
            due.write(&disk).unwrap().is_none(),
            "a removed directory: nothing to seal"
        );
    }

    #[test]
    fn a_seal_round_trips_and_every_flipped_bit_is_damage() {
        let encoded = encode(0x0123_4567_89ab_cdef);
        assert_eq!(decode(&encoded), Some(0x0123_4567_89ab_cdef));
        for bit in 0..SEAL_BYTES * 8 {
            let mut flipped = encoded;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode(&flipped), None, "bit {bit}");
        }
        assert_eq!(decode(&encoded[..11]), None);
        assert_eq!(
            Seal::of(Path::new("/s/files/3/overflow.log")).path,
            Path::new("/s/files/3/overflow.log.seal")
        );
    }
}
