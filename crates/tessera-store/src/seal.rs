//! Seals of append-only logs: the log's length at its last sync, kept beside it.
//!
//! A log cut at a record boundary (a lost or torn write of the disk, a bad copy) is a
//! well-formed shorter log, just as a process killed mid-append leaves one, so the log alone
//! cannot tell records a sync made durable (acknowledged) from records never synced. Each
//! sync that makes a log durable therefore first writes the log's length to `<log>.seal`
//! (length u64 LE, crc32c u32 LE of it), synced with the log; anything that shortens the log
//! writes the new length first, durably. A log found shorter than its seal lost synced
//! records; a longer one only has records not sealed yet. A missing seal (a log never synced)
//! or a damaged one tells nothing. The overflow log (`overflow.rs`) and the snapshot journal
//! (`snapshot.rs`) are sealed.

use std::path::{Path, PathBuf};

use tessera_wire::StorageError;

use crate::disk::{read_file, write_file_synced, Disk, FileHandle};
use crate::io::disk;

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

    /// Writes `len` without syncing, before a sync makes the log durable: the caller syncs
    /// the returned handle with the log, and the directory too if the seal is new (`true`).
    pub(crate) fn write(
        &self,
        on: &dyn Disk,
        len: u64,
    ) -> Result<(FileHandle, bool), StorageError> {
        let created = (on.kind(&self.path))
            .map_err(|e| self.error("stat", e))?
            .is_none();
        let file = on.open(&self.path).map_err(|e| self.error("open", e))?;
        (file.write_all_at(&encode(len), 0)).map_err(|e| self.error("write", e))?;
        Ok((file, created))
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
