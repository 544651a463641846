//! Intent records: what a RAID-4/5 read-modify-write is about to change, kept at the parity
//! server until its parity is written, so that a writer's death never leaves parity that a
//! later reconstruction would trust.
//!
//! # The write hole, and how the records close it
//!
//! A partial-stripe write changes data `D` to `D'` on a data column and parity `P` to
//! `P ^ D ^ D'` on the parity column: two servers, no atomic step across them. A client that
//! dies between the two leaves the data column holding `D'` (in whole or in part, per 4 KiB
//! block) and parity still `P`. Reconstructing any *other* column of the stripe from that
//! parity then yields `P ^ D' ^ rest`, which is wrong in every byte where `D != D'`: bytes
//! that were acknowledged long ago, on a column the write never touched, would be rebuilt
//! wrong for good.
//!
//! The protocol, under the stripe's parity lock (see `locks.rs`):
//!
//! 1. `LockParity` grants the lock (a fencing token) and returns the parity asked for, and
//!    any record a dead holder left (step 6).
//! 2. The client reads the old data `D` of each piece it will write.
//! 3. `RecordIntent` hands the parity server the pieces (column, range) and `D`. The server
//!    adds the span's current parity `P` and writes the record **before it answers**; the
//!    client writes no data before that answer. The record is not synced then: the store's
//!    `unsynced` mark is durable first (`boot.rs`), so a power loss before the next sync
//!    makes the whole store start over as a new incarnation, rebuilt from the others, and the
//!    record is not needed; a process crash keeps it in the page cache, which the store syncs
//!    at open; and the next sync makes it durable with everything else before the mark goes.
//! 4. The client writes `D'` to the data columns.
//! 5. `WriteParity` writes `P' = P ^ D ^ D'` and then deletes the record.
//! 6. If the holder dies (its connection closes, or its lease runs out while another locker
//!    waits), the lock passes on and the record stays. The next holder is handed it with its
//!    grant and *resolves* it before anything else: it reads what each piece's column holds
//!    now, `X`, and writes parity `P ^ D ^ X` over the span with an unlock. That is
//!    consistent with the data byte by byte, whether the column holds `D`, `D'` or a mix of
//!    blocks of both. A column it cannot read is rolled back instead: parity `P` (consistent
//!    with `D`) and the column recorded at the manager as owing the stripe, so that it is
//!    rebuilt to `D` and never serves what it holds.
//!
//! Until a record is resolved, nobody reconstructs from the span's parity alone: a degraded
//! read or a rebuild asks for the record (`ReadIntent`) and, inside the span, uses the
//! record's `P` and, for the pieces' columns, the record's `D` in place of what they hold.
//! `P ^ D ^ rest` is exactly the parity of the stripe as it was before the write, and the
//! columns the write did not touch still hold what they held then; so every byte outside
//! the write is reconstructed exactly, and a byte of the write itself comes back old (the
//! write was not acknowledged: its client died before step 5 was answered). A scrub holds the
//! lock and rewrites the whole unit's parity from checksummed data, which resolves the record
//! too. Any write of the redundancy file covering the span (a full-stripe write, a rebuilt
//! parity unit) computes parity from the data and deletes the record.
//!
//! Full-stripe writes take no lock and read nothing, so they cannot carry old bytes cheaply;
//! they take a *stale-parity record* instead (`stale.rs`: one request per parity column
//! before the data, written under the `unsynced` mark as an intent record is, cleared after; a stripe under an orphaned one is resolved by
//! recomputing its parity from the data, and a column lost before that reads as an error,
//! never as bytes). The module doc there argues that choice against journalling the stripe.
//!
//! # Each crash point
//!
//! - Client dies before step 3 is answered: no data written; parity is right. A torn record
//!   (server died while writing it) is still under its staging name `<name>.new` (a record
//!   is written whole, synced, then renamed) and is dropped at the next open: no data was
//!   written after it, since its answer never went out.
//! - Client dies between 3 and 5, after any number of its data writes reached disk: the record
//!   is kept (in the page cache across a server process crash, durable from the parity
//!   server's next sync on); reconstruction uses it, resolution makes parity match the data.
//! - The parity server loses power before its next sync: its `unsynced` mark is on disk, so
//!   the store starts over as a new incarnation and its parity is rebuilt from the data
//!   columns, whatever they hold; no record is needed. A data server that loses power with
//!   the write unsynced is rebuilt the same way, from the parity and the record.
//! - Client dies after 5 was sent: the parity server either wrote `P'` and deleted the record
//!   (consistent: the data writes were all answered before 5 was sent), or died itself between
//!   writing `P'` and deleting the record. A record describes the state *before* the write, so
//!   it stays correct whether parity already holds `P'`: resolution yields `P ^ D ^ D' = P'`.
//! - A slow holder whose lease was broken: its later `WriteParity` carries a stale token and is
//!   refused (nothing written); its data writes may land after the next holder resolved the
//!   record, which is the case of two overlapping writers (CSAR 5.1 makes no promise there);
//!   a scrub finds and repairs such parity. (The token is checked before the parity write,
//!   not in the same step: a write that passed the check and then took longer than a whole
//!   lease on the disk could land after the lock was broken.)
//! - Parity server lost: parity is rebuilt from the data columns, whatever they hold; the
//!   record goes with the server, and is not needed.
//!
//! Deleting a record is not synced at once; [`crate::Store::sync`] makes it durable with
//! everything else. A record resurrected by a power loss therefore implies that no sync ran
//! since it was deleted, so nothing written to the stripe since was acknowledged as durable.
//!
//! # Damage to a record
//!
//! A record under its own name was answered, so its writer may have died between data and
//! parity. One found damaged there (a flipped bit, cut short) or gone while the directory's
//! roster (`roster.rs`) names it is therefore never dropped as torn: its old parity and data
//! are lost, so its stripe is kept as an orphaned stale-parity record (`stale.rs`) instead.
//! Nothing reconstructs from that parity (a column of the stripe lost meanwhile reads as an
//! error, never as bytes), and the next lock holder or the torn-stripe resolver recomputes it
//! from the data, which is right whatever mix of old and new blocks the columns hold. Before
//! this, such a record was dropped at open and a later degraded read trusted the parity the
//! dead writer left.
//!
//! # On-disk format (version 1)
//!
//! ```text
//! <root>/intents/<file>.<stripe>
//!   magic "TSIR" | version u32 LE | crc32c u32 LE of all that follows | message_len u32 LE
//!   | ParityIntent (postcard) | old parity (span_len bytes) | old data (the pieces, in order)
//! <root>/intents/<file>.<stripe>.new   the same while being written (torn if found)
//! <root>/intents/roster                the records' names (`roster.rs`)
//! ```

use std::collections::{BTreeMap, HashMap};
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_wire::{FileId, ParityIntent, StorageError};

use crate::disk::{read_file, Disk, FileHandle};
use crate::io::{bad_request, disk, disk_format};
use crate::roster::{self, Roster, UnsyncedRecords, ROSTER_NAME};
use crate::REQUEST_BYTES_MAX;

/// Directory of intent records under the store's root.
pub(crate) const INTENTS_DIR: &str = "intents";
/// First bytes of a record.
const MAGIC: [u8; 4] = *b"TSIR";
/// Version of a record's format.
pub const INTENT_FORMAT_VERSION: u32 = 1;
/// Magic, version, checksum, message length.
const HEADER_BYTES: usize = 16;

/// Redundancy-file bytes `start..end` a record's span covers.
type Span = (u64, u64);

/// The records of one store: on disk, and their spans in memory so that a redundancy write
/// finds the records it supersedes without touching the disk.
pub(crate) struct Intents {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    spans: HashMap<FileId, BTreeMap<u64, Span>>,
    /// The names of the records on disk, so that a deleted one is found (`roster.rs`).
    roster: Roster,
    /// Records written since the last sync took them, and not deleted since.
    pub(crate) unsynced: UnsyncedRecords,
}

/// An unresolved record and its bytes: old parity of the span, then old data of the pieces.
pub type IntentRecord = (ParityIntent, Vec<u8>);

impl Intents {
    /// Opens (creating) the records directory under `root`, dropping torn records (a record
    /// still under its staging name, never answered). Returns the stripes whose record is
    /// damaged (cut short, a flipped bit) or lost (on its roster, `roster.rs`, with no file):
    /// it was answered, so its writer may have died between data and parity. The caller
    /// keeps them as orphaned stale-parity records and then calls [`Intents::drop_damaged`].
    pub(crate) fn open(
        disk: &Arc<dyn Disk>,
        root: &Path,
    ) -> Result<(Intents, Vec<(FileId, u64)>), StorageError> {
        let dir = root.join(INTENTS_DIR);
        let created = match disk.create_dir(&dir) {
            Ok(()) => true,
            Err(error) if error.kind() == ErrorKind::AlreadyExists => false,
            Err(error) => return Err(self::disk(format_args!("create {}", dir.display()), error)),
        };
        if created {
            crate::meta::sync_dir(&**disk, root)?;
        }
        let (roster, held) = Roster::load(&**disk, &dir)?;
        let mut intents = Intents {
            disk: Arc::clone(disk),
            dir,
            spans: HashMap::new(),
            unsynced: UnsyncedRecords::default(),
            roster,
        };
        let names = (intents.disk)
            .read_dir(&intents.dir)
            .map_err(|e| self::disk(format_args!("list intents"), e))?;
        let mut damaged = intents.load_all(&names)?;
        for name in held
            .as_ref()
            .map_or(Vec::new(), |held| roster::lost(held, &names))
        {
            tracing::error!(
                "intent record {name} under {} is lost (on the roster, no file): its stripe \
                 is kept as torn (stale parity)",
                intents.dir.display()
            );
            damaged.extend(parse_name(name));
        }
        Ok((intents, damaged))
    }

    /// Loads the records named `names`, dropping torn ones; returns the damaged ones.
    fn load_all(&mut self, names: &[String]) -> Result<Vec<(FileId, u64)>, StorageError> {
        let mut damaged = Vec::new();
        for name in names.iter().filter(|name| *name != ROSTER_NAME) {
            match parse_name(name) {
                Some((file, stripe)) => match self.load(file, stripe) {
                    Ok((intent, _)) => self.remember(file, stripe, &intent),
                    Err(error) => {
                        tracing::error!("{error}: its stripe is kept as torn (stale parity)");
                        damaged.push((file, stripe));
                    }
                },
                // Torn while being recorded (never answered, so no data was written after
                // it) or not ours: it describes nothing to resolve.
                None => (self.disk)
                    .remove_file(&self.dir.join(name))
                    .map_err(|e| disk(format_args!("remove torn intent {name}"), e))?,
            }
        }
        Ok(damaged)
    }

    /// Deletes the damaged records [`Intents::open`] returned, once their stripes are kept
    /// otherwise, and writes the roster again with the records kept (durably: the caller
    /// syncs the directory after).
    pub(crate) fn drop_damaged(&mut self, damaged: &[(FileId, u64)]) -> Result<(), StorageError> {
        for &(file, stripe) in damaged {
            let path = self.path(file, stripe);
            match self.disk.remove_file(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == ErrorKind::NotFound => {}
                Err(error) => return Err(disk(format_args!("remove {}", path.display()), error)),
            }
        }
        let names = (self.spans.iter())
            .flat_map(|(file, stripes)| stripes.keys().map(move |stripe| name(*file, *stripe)))
            .collect();
        self.roster.reset(&*self.disk, names)
    }

    /// Makes the roster durable (at a sync of the store).
    pub(crate) fn sync_roster(&mut self) -> Result<(), StorageError> {
        self.roster.sync()
    }

    /// Records `intent` for `stripe` of `file` with its old parity and old data, written
    /// and named but not synced (kept for the next sync, [`Intents::unsynced`]): the
    /// caller holds the store's `unsynced` mark across the call and owes the records
    /// directory a sync (see [`crate::Store::record_intent`]). Refused if the stripe has an
    /// unresolved record: it must be resolved first.
    pub(crate) fn record(
        &mut self,
        file: FileId,
        stripe: u64,
        intent: &ParityIntent,
        old_parity: &[u8],
        old_data: &[u8],
    ) -> Result<(), StorageError> {
        check(intent)?;
        assert_eq!(
            old_parity.len(),
            intent.span_len as usize,
            "span's old parity"
        );
        if old_data.len() as u64 != intent.old_data_bytes() {
            return Err(bad_request(format!(
                "intent carries {} bytes of old data, its pieces {}",
                old_data.len(),
                intent.old_data_bytes()
            )));
        }
        if self.has(file, stripe) {
            return Err(bad_request(format!(
                "stripe {stripe} of file {file} has an unresolved intent record"
            )));
        }
        let path = self.path(file, stripe);
        let bytes = encode(intent, old_parity, old_data);
        // Written whole under a staging name, then renamed: a record under its own name was
        // answered, so one found damaged there after a process crash is damage, never a torn
        // recording. (After a power loss the store holding it starts over: see the caller.)
        let handle = write_staged(&*self.disk, &path, &bytes)
            .map_err(|e| disk(format_args!("record intent {}", path.display()), e))?;
        self.roster.add(&*self.disk, name(file, stripe))?;
        self.remember(file, stripe, intent);
        self.unsynced.insert(path, handle);
        Ok(())
    }

    /// The unresolved record of `stripe` of `file`, if any.
    pub(crate) fn get(
        &self,
        file: FileId,
        stripe: u64,
    ) -> Result<Option<IntentRecord>, StorageError> {
        if !self.has(file, stripe) {
            return Ok(None);
        }
        self.load(file, stripe).map(Some)
    }

    /// Deletes the record of `stripe` of `file`, if any. Returns whether the directory changed
    /// (and owes a sync).
    pub(crate) fn clear(&mut self, file: FileId, stripe: u64) -> Result<bool, StorageError> {
        let Some(stripes) = self.spans.get_mut(&file) else {
            return Ok(false);
        };
        if stripes.remove(&stripe).is_none() {
            return Ok(false);
        }
        if stripes.is_empty() {
            self.spans.remove(&file);
        }
        self.roster.remove(&*self.disk, &name(file, stripe))?;
        let path = self.path(file, stripe);
        self.unsynced.remove(&path);
        match self.disk.remove_file(&path) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(true),
            Err(error) => Err(disk(format_args!("remove {}", path.display()), error)),
        }
    }

    /// Whether any record of `file` is held.
    pub(crate) fn has_records(&self, file: FileId) -> bool {
        self.spans.get(&file).is_some_and(|spans| !spans.is_empty())
    }

    /// Deletes the records whose span lies inside redundancy bytes `offset..offset+len` of
    /// `file` (that write computed parity from the data). Returns whether any was deleted.
    pub(crate) fn clear_covered(
        &mut self,
        file: FileId,
        offset: u64,
        len: u64,
    ) -> Result<bool, StorageError> {
        let Some(stripes) = self.spans.get(&file) else {
            return Ok(false);
        };
        let end = offset.saturating_add(len);
        let covered: Vec<u64> = stripes
            .iter()
            .filter(|(_, &(start, stop))| offset <= start && stop <= end)
            .map(|(&stripe, _)| stripe)
            .collect();
        let mut changed = false;
        for stripe in covered {
            changed |= self.clear(file, stripe)?;
        }
        Ok(changed)
    }

    /// Deletes every record of `file` (it was removed).
    pub(crate) fn clear_file(&mut self, file: FileId) -> Result<bool, StorageError> {
        let stripes: Vec<u64> = self
            .spans
            .get(&file)
            .map(|s| s.keys().copied().collect())
            .unwrap_or_default();
        let mut changed = false;
        for stripe in stripes {
            changed |= self.clear(file, stripe)?;
        }
        Ok(changed)
    }

    /// The redundancy-file spans of `file`'s records, `(start, end)` bytes.
    pub(crate) fn spans_of(&self, file: FileId) -> Vec<Span> {
        self.spans
            .get(&file)
            .map(|stripes| stripes.values().copied().collect())
            .unwrap_or_default()
    }

    /// The records directory, for syncing.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn has(&self, file: FileId, stripe: u64) -> bool {
        self.spans
            .get(&file)
            .is_some_and(|stripes| stripes.contains_key(&stripe))
    }

    fn remember(&mut self, file: FileId, stripe: u64, intent: &ParityIntent) {
        let start = intent.unit_offset + u64::from(intent.span_start);
        let span = (start, start + u64::from(intent.span_len));
        self.spans.entry(file).or_default().insert(stripe, span);
    }

    fn path(&self, file: FileId, stripe: u64) -> PathBuf {
        self.dir.join(name(file, stripe))
    }

    fn load(&self, file: FileId, stripe: u64) -> Result<IntentRecord, StorageError> {
        let path = self.path(file, stripe);
        let bytes =
            read_file(&*self.disk, &path).map_err(|e| disk(format_args!("read intent"), e))?;
        decode(&bytes).ok_or_else(|| {
            disk_format(format!(
                "intent record {} is damaged (bad header, checksum or length)",
                path.display()
            ))
        })
    }
}

/// Bounds a record from the wire: a span of at most one request, pieces inside it.
fn check(intent: &ParityIntent) -> Result<(), StorageError> {
    let well_formed = intent.span_len > 0
        && intent.span_len <= REQUEST_BYTES_MAX
        && intent.is_well_formed(u64::from(intent.span_start) + u64::from(intent.span_len))
        && intent
            .unit_offset
            .checked_add(u64::from(intent.span_start) + u64::from(intent.span_len))
            .is_some_and(|end| end <= crate::FILE_BYTES_MAX)
        && !intent.pieces.is_empty()
        && intent.old_data_bytes() <= u64::from(REQUEST_BYTES_MAX);
    if well_formed {
        Ok(())
    } else {
        Err(bad_request(format!("malformed intent record {intent:?}")))
    }
}

/// A record's file name: `<file>.<stripe>`.
fn name(file: FileId, stripe: u64) -> String {
    format!("{file}.{stripe}")
}

fn parse_name(name: &str) -> Option<(FileId, u64)> {
    let (file, stripe) = name.split_once('.')?;
    Some((file.parse().ok()?, stripe.parse().ok()?))
}

/// Where a record (or a stale-parity record, `stale.rs`) is written before it is renamed to
/// `path`: a name no record parses as, so that one torn there is dropped at open.
/// Writes `bytes` as a new file under `path`'s staging name ([`staging_path`]) and renames it
/// to `path`, so that a process that dies while writing leaves only a staged file, never a
/// short record under its own name. Not synced (the caller owes a sync). Returns the file,
/// open.
pub(crate) fn write_staged(disk: &dyn Disk, path: &Path, bytes: &[u8]) -> io::Result<FileHandle> {
    let staging = staging_path(path);
    let handle = disk.create(&staging)?;
    handle.write_all_at(bytes, 0)?;
    disk.rename(&staging, path)?;
    Ok(handle)
}

pub(crate) fn staging_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .expect("a record has a name")
        .to_os_string();
    name.push(".new");
    path.with_file_name(name)
}

fn encode(intent: &ParityIntent, old_parity: &[u8], old_data: &[u8]) -> Vec<u8> {
    let message = tessera_wire::encode_message(intent);
    let mut body = Vec::with_capacity(4 + message.len() + old_parity.len() + old_data.len());
    body.extend_from_slice(&(message.len() as u32).to_le_bytes());
    body.extend_from_slice(&message);
    body.extend_from_slice(old_parity);
    body.extend_from_slice(old_data);
    let mut bytes = Vec::with_capacity(12 + body.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&INTENT_FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    bytes
}

fn decode(bytes: &[u8]) -> Option<IntentRecord> {
    if bytes.len() < HEADER_BYTES || bytes[..4] != MAGIC {
        return None;
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    if word(4) != INTENT_FORMAT_VERSION || word(8) != crc32c::crc32c(&bytes[12..]) {
        return None;
    }
    let message_len = word(12) as usize;
    let message = bytes.get(HEADER_BYTES..HEADER_BYTES.checked_add(message_len)?)?;
    let intent: ParityIntent = tessera_wire::decode_message(message).ok()?;
    let rest = &bytes[HEADER_BYTES + message_len..];
    let expected = u64::from(intent.span_len) + intent.old_data_bytes();
    (rest.len() as u64 == expected).then(|| (intent, rest.to_vec()))
}
