//! One storage server's on-disk store, and its table of parity locks.
//!
//! This crate owns everything a storage server keeps on its local disk for the files striped
//! over it: per file, the data file (its column's stripe units), the redundancy file (parity
//! units, or mirror copies under RAID-1), and CSAR's overflow region (Hybrid partial-stripe
//! writes, kept apart so the old blocks still match the parity until a full-stripe write
//! supersedes them). It also owns the FIFO parity locks of CSAR 5.1 ([`ParityLocks`], leased
//! and fenced by a token) and the intent records that close the RAID-5 write hole: what a
//! read-modify-write is about to change, durable at the parity server before the data is
//! written, so that a writer that dies between its data and its parity never makes a later
//! reconstruction wrong ([`Store::record_intent`]; the `intent` module's doc states the
//! protocol, each crash point, and why no acknowledged byte is lost), and the stale-parity
//! records of full-stripe writes ([`Store::record_stale`]; the `stale` module's doc argues
//! the design and what an interrupted full-stripe write may leave unreadable).
//!
//! What it must never do:
//! - return bytes that fail their checksum: a bad block is [`StorageError::Corrupt`], always;
//! - touch the network, or know about stripes, columns or other servers (the offsets it is
//!   given are already local to this server's files; the layout crate computes them);
//! - block an async runtime: [`Store`] does blocking I/O and is meant to be called from
//!   `spawn_blocking`; only [`ParityLocks::lock`] is async;
//! - touch a file but through its [`Disk`]: the real file system ([`RealDisk`], what
//!   [`Store::open`] uses) or another given to [`Store::open_on`] (the simulator's in-memory
//!   disk with power losses, torn writes and flipped bits).
//!
//! # On-disk format (version 2)
//!
//! ```text
//! <root>/store.lock        held with flock(LOCK_EX) while a Store is open
//! <root>/boot              the machine's boot id when the store last opened (see `boot.rs`)
//! <root>/unsynced          present while some answered write is not synced (see `boot.rs`)
//! <root>/kept/<F>/         a file's directory as it was when a power loss renewed the store,
//!                          until a rebuild puts it back or drops it (see `kept.rs`)
//! <root>/kept/<F>.restored put back by a rebuild that has not cleared its debts yet
//! <root>/store.toml        format_version = 2, incarnation = "<16 hex digits>", server_id = N,
//!                          cluster = "<16 hex digits>" (the cluster joined),
//!                          last line checksum = "<crc32c of the bytes before it, 8 hex digits>"
//! <root>/files/<F>/data            data file, written in whole 4 KiB blocks
//! <root>/files/<F>/data.crc        8 bytes per block: crc32c u32 LE, marker u32 LE ("TSB1")
//! <root>/files/<F>/redundancy      redundancy file, same rules as data
//! <root>/files/<F>/redundancy.crc
//! <root>/files/<F>/overflow        overflow bytes, append-only; each entry's crc32c is in its
//!                                  log record
//! <root>/files/<F>/overflow.log    header "TSOL" + version u32 LE + crc32c u32 LE, then 36-byte
//!                                  records, each with its own crc32c (see `overflow.rs`)
//! <root>/files/<F>/overflow.log.new  a shorter log being written, before it is renamed over
//! <root>/files/<F>/overflow.log.seal  the log's length at its last sync: u64 LE + crc32c
//!                                  u32 LE (a shorter log lost synced records; see `seal.rs`)
//! <root>/files/<F>/snap.journal.seal  the same for the snapshot journal
//! <root>/files/<F>/discard.data    a discard of the data file's tail in progress: its start
//!                                  u64 LE + crc32c u32 LE (`discard.redundancy` likewise;
//!                                  see `region.rs`'s `CutMark`)
//! <root>/intents/<F>.<stripe>      an unresolved intent record: "TSIR" + version u32 LE
//!                                  (INTENT_FORMAT_VERSION) + crc32c + the record
//! <root>/stale/<F>.<token>.<S>-<E> a stale-parity record of a full-stripe write of stripes
//!                                  S..E: "TSSP" + version u32 LE (STALE_FORMAT_VERSION) +
//!                                  crc32c + ranges
//! <root>/intents/roster, stale/roster  the names of the records in the directory: length
//!                                  u32 LE + crc32c u32 LE + names (see `roster.rs`)
//! <root>/tombstones.0, .1        ids of files the manager removed, as ranges, in two copies:
//!                                  "TSTB" + version u32 LE (TOMBSTONE_FORMAT_VERSION) +
//!                                  sequence + ranges + crc32c (see `tombstone.rs`)
//! <root>/files/<F>/record          the file's metadata for recovery (see `record`, own version)
//! <root>/files/<F>/snap.journal    copy-on-write snapshots: epochs begun and blocks copied
//! <root>/files/<F>/snap.<E>.*      blocks copied for snapshot epoch E (see `snapshot`, own
//!                                  version)
//! ```
//!
//! Every byte is covered by a checksum, so one flipped bit anywhere is found:
//! - A block is checked against its entry on every read. An entry of all zeros means the block
//!   was never written and must read as zeros; a written entry carries the marker, so no single
//!   flipped bit turns it into "never written" (it reads as [`StorageError::Corrupt`]).
//! - An overflow log record that fails its checksum, anywhere but in a torn tail, is damage:
//!   every overflow range of the file reads as [`StorageError::Corrupt`] on this server until
//!   the client has rewritten it from redundancy (details in `overflow.rs`); once no entry is
//!   live, the log is replaced by one holding only the ranges still damaged. A damaged log
//!   header is rewritten in place (it holds nothing but constants).
//! - A `store.toml` that fails its checksum makes [`Store::open`] fail with an error naming
//!   the file: the server does not start. The operator moves the directory away and starts the
//!   server on an empty one; it joins as a new incarnation, and `tessera rebuild` restores its
//!   data from the others.
//! - A file's `record` (its metadata for `tessera manager recover`, [`FileRecord`]) carries
//!   its own crc32c; a damaged one is listed as damaged, never read, and recovery takes the
//!   file's record from another column's server.
//! - A tombstone copy that fails its checksum is replaced by the other copy (`tombstone.rs`).
//! - An intent or stale-parity record that fails its checksum, is cut short, or is gone while
//!   its directory's roster names it, is kept as an orphaned stale-parity record of its
//!   stripes (never dropped: it was answered); a damaged roster is written again.
//! - A `store.toml` that is missing while the store holds files or records makes
//!   [`Store::open`] fail naming it (it is not taken for a new store, which would delete them).
//! - A flipped bit in overflow bytes that no live entry refers to changes nothing that is ever
//!   read; those bytes are dropped when the overflow files are next emptied.
//!
//! Version 1 stores (no checksum in `store.toml` or the log header) are refused by
//! [`Store::open`] with an error saying so; there is no migration: start the server on an
//! empty directory and rebuild it from the others, as for a damaged `store.toml`.
//!
//! Overflow entries are addressed by a byte range of the primary column's data file and carry a
//! role ([`OverflowRole::Primary`] or [`OverflowRole::Mirror`]). Per role, live entries never
//! overlap: a newer entry trims the parts of older ones it shadows, exactly as an invalidation
//! would, so the table replayed from the log equals the table built in memory.
//!
//! # Durability
//!
//! Writes reach the page cache; [`Store::sync`] makes everything written before it durable
//! (`fdatasync` of each file written since the last sync, and of the directories created or
//! emptied since). [`Store::open_on`] syncs the file system first (a process that died before
//! may have left answered writes in the page cache). If the machine went down (power loss,
//! kernel crash) while answered writes were not synced, the store opens empty as a new
//! incarnation, which the manager has rebuilt from the other servers (`boot.rs`); its old
//! bytes are kept aside, and put back by a rebuild that has no other server to go on
//! ([`Store::kept_bytes`], `kept.rs`). A crash may leave a block whose checksum does not match its bytes; reading
//! it reports [`StorageError::Corrupt`] and the client rebuilds it from redundancy.
//!
//! # Reads that never wait
//!
//! [`Store::read_cached`] answers a read only from the page cache (`preadv2` with
//! `RWF_NOWAIT`), and says so when it would have to wait for the disk or for another operation
//! on the file. A server answers those reads on its network thread; the rest go to its blocking
//! pool through [`Store::read`].
//!
//! ```
//! use tessera_layout::{OverflowRole, Region};
//! use tessera_store::Store;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path()).unwrap();
//! store.write(7, Region::Data, 100, b"stripe unit", false).unwrap();
//! store.overflow_write(7, OverflowRole::Primary, 100, b"STRIPE").unwrap();
//! let newest = store.read(7, Region::Data, 100, 11, true).unwrap();
//! assert_eq!(newest, b"STRIPE unit");
//! let in_place = store.read(7, Region::Data, 100, 11, false).unwrap();
//! assert_eq!(in_place, b"stripe unit");
//! store.sync().unwrap();
//! ```

mod boot;
mod disk;
mod intent;
mod io;
mod kept;
mod locks;
mod memdisk;
mod meta;
mod overflow;
mod record;
mod region;
mod roster;
mod seal;
mod snapshot;
mod stale;
mod store;
mod tombstone;

pub use disk::{Disk, DiskFile, DiskLock, DiskSpace, EntryKind, FileHandle, RealDisk};
pub use intent::{IntentRecord, INTENT_FORMAT_VERSION};
pub use locks::ParityLocks;
pub use memdisk::{BitFlip, MemDisk, PowerLoss, MEM_DISK_BYTES, SECTOR_BYTES};
pub use record::{FileRecord, RecordError, RecordPage, RECORD_FORMAT_VERSION};
pub use snapshot::SNAPSHOT_FORMAT_VERSION;
pub use stale::{StaleState, STALE_FORMAT_VERSION, STALE_RECORDS_MAX};
pub use store::{DiskUsage, Store};
pub use tombstone::{TOMBSTONE_FORMAT_VERSION, TOMBSTONE_RANGES_MAX};

pub use tessera_layout::{OverflowRole, Region};
pub use tessera_wire::{FileId, IntentPiece, OverflowExtent, ParityIntent, StorageError};

/// Bytes per checksummed block: the unit of every write to the data and redundancy files.
pub const BLOCK_BYTES: u64 = 4096;

/// Largest read, write or overflow entry, in bytes: one frame's payload.
pub const REQUEST_BYTES_MAX: u32 = tessera_wire::PAYLOAD_BYTES_MAX;

/// Largest offset (exclusive end) in a data, redundancy or overflow address space: 1 TiB, the
/// layout's [`tessera_layout::COLUMN_BYTES_MAX`], from which a whole file's maximum size
/// follows ([`tessera_layout::Layout::file_bytes_max`]).
pub const FILE_BYTES_MAX: u64 = tessera_layout::COLUMN_BYTES_MAX;

/// Most overflow extents one listing returns, so that it fits in one message.
pub const LIST_EXTENTS_MAX: usize = 1 << 18;

/// Most files whose state and open handles are cached at once (six handles each).
pub const OPEN_FILES_MAX: usize = 64;

/// Version of `store.toml` and of the layout of the files it describes (2: `store.toml` and
/// the overflow log's header checksummed, damaged log records told apart from torn tails).
pub const STORE_FORMAT_VERSION: u32 = 2;
