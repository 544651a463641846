//! Stale-parity records: the full-stripe write's side of the write hole.
//!
//! A full-stripe write (RAID-4/5, and Hybrid's whole stripes) writes every data unit of a
//! stripe and its freshly computed parity in parallel, with no lock: there is nothing to read
//! first. A writer that dies part-way leaves some columns new, some old, and parity of either
//! kind, so parity no longer matches the data. Two things then go wrong (issue 15 item 1): a
//! later read-modify-write computes `P ^ D ^ D'` from that parity and stays inconsistent, so
//! its *acknowledged* bytes are rebuilt wrong once a column is lost; and a degraded read
//! reconstructs the lost column as neither the old nor the new bytes.
//!
//! # The record, md-RAID write-intent-bitmap style
//!
//! Before writing any data of full stripes of a committed file, the writer sends each parity
//! column a record naming the range of stripes (`RecordStale`); the server writes it
//! **before it answers**, and the writer writes nothing before that answer. As an intent
//! record (`intent.rs`), it is not synced then: the store's `unsynced` mark is durable
//! first, so a power loss before the next sync makes the store start over (rebuilt from the
//! others), a process crash keeps the record in the page cache, and the next sync makes it
//! durable before the mark goes. The record says only "parity of these stripes may not
//! match their data"; it carries no bytes, so it costs one small write per parity column
//! per call, not a read of the stripe. Once every data and parity write of the call is
//! answered, the writer clears it (`ClearStale` with its token; not synced: a record
//! resurrected by a power loss only makes someone recompute parity that was right).
//!
//! A record is leased like a parity lock: the writer renews it while its writes are out, and
//! a record whose lease has run out (its writer died, or the server restarted, which loads
//! every record as orphaned) is **orphaned**. Records never lock and writers never wait on
//! them. Who meets one:
//!
//! - `LockParity` on a stripe under a *live* record waits (bounded) until it is cleared or
//!   orphaned, so that no read-modify-write or scrub reads a stripe in the middle of a
//!   full-stripe write; an orphaned one is reported with the grant and the holder resolves it
//!   first: it reads every data unit of the stripe, writes parity computed from them, and
//!   clears the stripe from the orphaned records (`ClearStale` without a token). Parity then
//!   matches the data byte by byte, whatever mix of old and new units it holds.
//! - A degraded read or rebuild asks (`ReadIntent` says whether the stripe is under a record)
//!   and reconstructs nothing from such parity: a data column lost or corrupt under a record
//!   cannot be recovered (neither its old nor its new bytes are implied by parity and the
//!   others), so its bytes read as an error, never as bytes; a rebuild leaves that stripe
//!   owed (so every later read of it is an error too) and goes on with the rest. Every data
//!   byte of such a stripe belongs to the interrupted write, which was not acknowledged, unless
//!   a Hybrid overflow write was acknowledged there since: its bytes then read as an error
//!   too, with that one column lost, until a scrub or a whole-stripe write resolves the stripe.
//! - A later full-stripe write of the stripe that completes takes its stripes out of every
//!   record along with deleting its own (its parity was computed from the data it wrote,
//!   which supersedes an earlier writer's, live or dead); a rebuild of a parity column and a
//!   scrub of the stripe take it out of the orphaned ones.
//! - A degraded read that finds a *live* record (`ReadIntent`) is not refused: the server
//!   waits (at most 0.5 s per request, below any client's request timeout) until it is
//!   cleared or orphaned and says it waited; the client then reads the stripe again (what it
//!   read may be half of that write), up to 8 times, and fails with `LockBusy` only after that.
//!
//! # Who resolves an orphaned record: the parity server's daemon, as a client
//!
//! Nobody would otherwise: a torn stripe waits for its next writer, a scrub or a rebuild, and
//! meanwhile the loss of one of its data columns makes the stripe unreadable. Resolving needs
//! every data unit of the stripe, which live on other servers, and servers never call each
//! other (their protocol is answers to clients; only the manager is called, and it calls no
//! one). So the resolver is a client: `ListStale` returns the stripes of records whose lease
//! has run out, and `Client::resolve_torn` locks each one (the grant hands it the orphaned
//! record) and does what a scrub of the stripe does. The `tessera server` daemon runs it for
//! its own store every 2 s with the admin's credential (derived from the cluster secret it
//! was given), so a torn stripe is resolved within about 3 s of its writer's death while
//! every column is up. A stripe with a column lost or owed is left for a later pass (a
//! rebuild of that column finds it still torn and leaves it owed, as before). Not the store:
//! it cannot read the other columns; not the manager: it holds no data path.
//!
//! A slow writer whose lease was broken is not fenced (its data writes carry no token): its
//! late writes after a resolution are the case of two overlapping writers, for which CSAR 5.1
//! makes no promise; a scrub repairs that parity.
//!
//! # Why not more
//!
//! Making a degraded read of an interrupted full-stripe write return old or new bytes needs
//! the old (or the new) data of every column somewhere else, that is, journalling the whole
//! stripe: twice the bytes of every large write. The record keeps the cost of a large write to
//! one small request per parity column, and only bytes that were never acknowledged (or, on
//! Hybrid, acknowledged overflow bytes of such a stripe) can become unreadable, and only while
//! a column is lost before anyone touched the stripe again. Writes into a file not yet
//! committed (the pending file of an atomic-replace `put`) take no record: if their client
//! dies, the whole file is discarded.
//!
//! # On-disk format (version 1)
//!
//! ```text
//! <root>/stale/<file>.<token>.<start>-<end>
//!   magic "TSSP" | version u32 LE | crc32c u32 LE of all that follows | ranges u32 LE
//!   | (start u64 LE, end u64 LE) per range of stripes, sorted and disjoint
//! <root>/stale/<name>.new   a record being written or rewritten (torn if found)
//! <root>/stale/roster       the records' names (`roster.rs`)
//! ```
//!
//! The name gives the stripes the record was taken for (a superset of what is left of it
//! after resolutions), so that one found damaged (a flipped bit, cut short) or deleted (gone
//! while the roster names it) is kept as covering them, orphaned, and written again: it was
//! answered, so a full-stripe writer may have died under it, and dropping it would let a
//! degraded read trust that parity. Only a record being written is torn, and it is under its
//! staging name. Records named `<file>.<token>` (before names carried stripes) are still
//! read; a damaged one of those is dropped, logged, as before.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_wire::{FileId, IndexRange, StorageError};
use tokio::time::Instant;

use crate::disk::{read_file, write_file_synced, Disk};
use crate::intent::{staging_path, write_staged};
use crate::io::{bad_request, disk};
use crate::roster::{self, Roster, UnsyncedRecords, ROSTER_NAME};

/// Directory of stale-parity records under the store's root.
pub(crate) const STALE_DIR: &str = "stale";
/// First bytes of a record.
const MAGIC: [u8; 4] = *b"TSSP";
/// Version of a record's format.
pub const STALE_FORMAT_VERSION: u32 = 1;
/// Magic, version, checksum, range count.
const HEADER_BYTES: usize = 16;
/// Most records one store keeps at once (a writer holds one per parity column per write
/// call): a bound on what a hostile client can make the server keep.
pub const STALE_RECORDS_MAX: usize = 65_536;
/// Most ranges one record holds (it starts with one; resolving a stripe in its middle splits
/// it).
const RANGES_MAX: usize = 4096;

/// Whether a stripe's parity may not match its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleState {
    /// No record covers the stripe.
    Clean,
    /// A record whose writer still renews it covers the stripe, until `until` at least.
    Live {
        /// When the latest lease among the covering records ends.
        until: Instant,
    },
    /// Only records whose lease ran out cover the stripe: resolve it before trusting parity.
    Orphaned,
}

/// One record: a file's stripes, and when its lease ends.
struct Record {
    file: FileId,
    stripes: Vec<IndexRange>,
    lease_end: Instant,
    /// The stripes its name gives (those it was recorded with, a superset of `stripes`);
    /// `None` for a record named before names carried them (format as before).
    named: Option<IndexRange>,
}

impl Record {
    /// A record found on disk at open, its lease run out at `now`.
    fn orphaned(
        file: FileId,
        stripes: Vec<IndexRange>,
        named: Option<IndexRange>,
        now: Instant,
    ) -> Record {
        Record {
            file,
            stripes,
            lease_end: now,
            named,
        }
    }
}

/// The stale-parity records of one store, on disk and in memory.
pub(crate) struct StaleRecords {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    records: BTreeMap<u64, Record>,
    token_next: u64,
    /// The names of the records on disk, so that a deleted one is found (`roster.rs`).
    roster: Roster,
    /// Records written since the last sync took them, and not deleted since.
    pub(crate) unsynced: UnsyncedRecords,
}

impl StaleRecords {
    /// Opens (creating) the records directory under `root`. Every record found is orphaned
    /// (its writer's lease did not survive the restart). A torn one (under its staging name)
    /// is dropped: it was never answered, so no data was written under it. A damaged one
    /// (cut short, a flipped bit) or a lost one (on the roster, `roster.rs`, with no file)
    /// was answered: it is kept as covering the stripes its name gives, and written again.
    pub(crate) fn open(disk: &Arc<dyn Disk>, root: &Path) -> Result<StaleRecords, StorageError> {
        let dir = root.join(STALE_DIR);
        match disk.create_dir(&dir) {
            Ok(()) => crate::meta::sync_dir(&**disk, root)?,
            Err(error) if error.kind() == ErrorKind::AlreadyExists => {}
            Err(error) => return Err(self::disk(format_args!("create {}", dir.display()), error)),
        }
        let names = disk
            .read_dir(&dir)
            .map_err(|e| self::disk(format_args!("list stale"), e))?;
        let (roster, held) = Roster::load(&**disk, &dir)?;
        let mut stale = StaleRecords {
            disk: Arc::clone(disk),
            dir,
            records: BTreeMap::new(),
            token_next: 0,
            roster,
            unsynced: UnsyncedRecords::default(),
        };
        let now = Instant::now();
        let mut damaged = stale.load_all(&names, now)?;
        for name in held
            .as_ref()
            .map_or(Vec::new(), |h| roster::lost(h, &names))
        {
            let what = format!("stale-parity record {name} is lost (on the roster, no file)");
            damaged.extend(stale.keep_by_name(name, &what, now));
        }
        for &token in &damaged {
            stale.rewrite(token)?;
        }
        if !damaged.is_empty() {
            crate::meta::sync_dir(&**disk, &stale.dir)?;
        }
        stale.token_next = (stale.records.keys().next_back())
            .map_or(1, |&last| last + 1)
            .max(rand::random::<u64>() >> 16);
        let names = stale.records.keys().map(|&token| stale.name_of(token));
        let names = names.collect();
        stale.roster.reset(&**disk, names)?;
        Ok(stale)
    }

    /// Loads the records named `names` as orphaned at `now`, dropping torn ones; returns the
    /// tokens of damaged ones, kept by their names.
    fn load_all(&mut self, names: &[String], now: Instant) -> Result<Vec<u64>, StorageError> {
        let mut damaged = Vec::new();
        for name in names.iter().filter(|name| *name != ROSTER_NAME) {
            let path = self.dir.join(name);
            let Some((file, token, named)) = parse_name(name) else {
                (self.disk)
                    .remove_file(&path)
                    .map_err(|e| disk(format_args!("remove torn stale record {name}"), e))?;
                continue;
            };
            let read = read_file(&*self.disk, &path).ok();
            if let Some(stripes) = read.as_deref().and_then(decode) {
                let record = Record::orphaned(file, stripes, named, now);
                self.records.insert(token, record);
                continue;
            }
            let what = format!("stale-parity record {name} is damaged");
            match self.keep_by_name(name, &what, now) {
                Some(token) => damaged.push(token),
                None => (self.disk)
                    .remove_file(&path)
                    .map_err(|e| disk(format_args!("remove {name}"), e))?,
            }
        }
        Ok(damaged)
    }

    /// Keeps the record named `name` as covering the stripes its name gives (its file is
    /// damaged or gone: `what`); its token, or `None` if its name gives no stripes (a record
    /// named before names did: logged, and a scrub of the file resolves what it covered).
    fn keep_by_name(&mut self, name: &str, what: &str, now: Instant) -> Option<u64> {
        let Some((file, token, Some(named))) = parse_name(name) else {
            tracing::error!(
                "{what} under {}: its name gives no stripes",
                self.dir.display()
            );
            return None;
        };
        tracing::error!(
            "{what} under {}: kept as covering the stripes its name gives",
            self.dir.display()
        );
        let record = Record::orphaned(file, vec![named], Some(named), now);
        self.records.insert(token, record);
        Some(token)
    }

    /// Makes the roster durable (at a sync of the store).
    pub(crate) fn sync_roster(&mut self) -> Result<(), StorageError> {
        self.roster.sync()
    }

    /// Records that parity of `stripes` of `file` may not match its data (written, not
    /// synced: the caller holds the store's `unsynced` mark), leased until
    /// `lease_end`; returns the record's token.
    pub(crate) fn record(
        &mut self,
        file: FileId,
        stripes: IndexRange,
        lease_end: Instant,
    ) -> Result<u64, StorageError> {
        if stripes.is_empty() {
            return Err(bad_request("a stale-parity record of no stripes"));
        }
        if self.records.len() >= STALE_RECORDS_MAX {
            return Err(bad_request(format!(
                "{STALE_RECORDS_MAX} stale-parity records are open at this server"
            )));
        }
        let token = self.token_next;
        self.token_next += 1;
        let path = self.path(file, token, Some(stripes));
        // Written whole under a staging name, then renamed: a record under its own name was
        // answered, so one found damaged there is damage, never a torn recording.
        // Not synced: the caller holds the store's `unsynced` mark and owes the directory a
        // sync (see `Store::record_stale`).
        let handle = write_staged(&*self.disk, &path, &encode(&[stripes]))
            .map_err(|e| disk(format_args!("record {}", path.display()), e))?;
        self.unsynced.insert(path, handle);
        (self.roster).add(&*self.disk, name(file, token, Some(stripes)))?;
        self.records.insert(
            token,
            Record {
                file,
                stripes: vec![stripes],
                lease_end,
                named: Some(stripes),
            },
        );
        Ok(token)
    }

    /// Extends the lease of record `token` of `file` to `lease_end` (a record loaded after a
    /// restart is live again). [`StorageError::StaleLock`] if there is no such record.
    pub(crate) fn renew(
        &mut self,
        file: FileId,
        token: u64,
        lease_end: Instant,
    ) -> Result<(), StorageError> {
        match self.records.get_mut(&token) {
            Some(record) if record.file == file => {
                record.lease_end = record.lease_end.max(lease_end);
                Ok(())
            }
            _ => Err(StorageError::StaleLock { stripe: 0, token }),
        }
    }

    /// Deletes record `token` of `file` if given (its writer finished), and takes `stripes` out
    /// of the other records of `file` (their parity was just computed from the data): of
    /// every one if `token` is given (a writer that rewrote those stripes whole supersedes
    /// any earlier writer of them), of the orphaned ones otherwise (a resolver must never
    /// clear a stripe a live writer is still writing). Returns whether the directory
    /// changed.
    pub(crate) fn clear(
        &mut self,
        file: FileId,
        token: Option<u64>,
        stripes: IndexRange,
        now: Instant,
    ) -> Result<bool, StorageError> {
        let mut changed = false;
        if let Some(token) = token {
            if self.records.get(&token).is_some_and(|r| r.file == file) {
                changed |= self.remove_file(token)?;
            }
        }
        let covered: Vec<u64> = self
            .records
            .iter()
            .filter(|(_, r)| r.file == file && (token.is_some() || r.lease_end <= now))
            .filter(|(_, r)| r.stripes.iter().any(|s| overlap(s, &stripes)))
            .map(|(&token, _)| token)
            .collect();
        for token in covered {
            let record = self.records.get_mut(&token).expect("just listed");
            let left = subtract(&record.stripes, stripes);
            if left.is_empty() {
                changed |= self.remove_file(token)?;
            } else {
                record.stripes = left;
                self.rewrite(token)?;
                changed = true;
            }
        }
        Ok(changed)
    }

    /// Deletes every record of `file` (it was removed).
    pub(crate) fn clear_file(&mut self, file: FileId) -> Result<bool, StorageError> {
        let tokens: Vec<u64> = self
            .records
            .iter()
            .filter(|(_, r)| r.file == file)
            .map(|(&token, _)| token)
            .collect();
        let mut changed = false;
        for token in tokens {
            changed |= self.remove_file(token)?;
        }
        Ok(changed)
    }

    /// The stripes of records whose lease has run out at `now`, per file (at most `max`
    /// ranges): what a resolver has to visit.
    pub(crate) fn orphaned(&self, now: Instant, max: usize) -> Vec<(FileId, IndexRange)> {
        self.records
            .values()
            .filter(|r| r.lease_end <= now)
            .flat_map(|r| r.stripes.iter().map(|s| (r.file, *s)))
            .take(max)
            .collect()
    }

    /// Whether `stripe` of `file` is under a record at `now`, and of which kind.
    pub(crate) fn state(&self, file: FileId, stripe: u64, now: Instant) -> StaleState {
        let covering = self
            .records
            .values()
            .filter(|r| r.file == file && r.stripes.iter().any(|s| s.contains(stripe)));
        let mut state = StaleState::Clean;
        for record in covering {
            state = match state {
                _ if record.lease_end <= now => match state {
                    StaleState::Clean => StaleState::Orphaned,
                    other => other,
                },
                StaleState::Live { until } => StaleState::Live {
                    until: until.max(record.lease_end),
                },
                _ => StaleState::Live {
                    until: record.lease_end,
                },
            };
        }
        state
    }

    /// Whether any record of `file`, live or orphaned, is kept.
    pub(crate) fn has_file(&self, file: FileId) -> bool {
        self.records.values().any(|r| r.file == file)
    }

    /// Number of records kept.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// The records directory, for syncing.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// A record's file: `<file>.<token>.<start>-<end>`, the stripes it was recorded with in
    /// its name, so that a damaged one still says what it covers.
    fn path(&self, file: FileId, token: u64, named: Option<IndexRange>) -> PathBuf {
        self.dir.join(name(file, token, named))
    }

    fn name_of(&self, token: u64) -> String {
        let record = &self.records[&token];
        name(record.file, token, record.named)
    }

    fn path_of(&self, token: u64) -> PathBuf {
        self.dir.join(self.name_of(token))
    }

    /// Forgets record `token` and deletes its file (not synced: see the module doc).
    fn remove_file(&mut self, token: u64) -> Result<bool, StorageError> {
        let path = self.path_of(token);
        self.roster.remove(&*self.disk, &self.name_of(token))?;
        self.records.remove(&token);
        self.unsynced.remove(&path);
        match self.disk.remove_file(&path) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(true),
            Err(error) => Err(disk(format_args!("remove {}", path.display()), error)),
        }
    }

    /// Replaces a shrunk record's file atomically: a torn rewrite must never drop the stripes
    /// still under it, so the new file is synced before it is renamed over the old one.
    fn rewrite(&self, token: u64) -> Result<(), StorageError> {
        let record = &self.records[&token];
        let mut ranges = record.stripes.clone();
        if ranges.len() > RANGES_MAX {
            // Keep one range spanning them all: a superset only costs needless resolutions.
            let (first, last) = (ranges[0].start, ranges[ranges.len() - 1].end);
            ranges = vec![IndexRange::new(first, last)];
        }
        let path = self.path_of(token);
        let staging = staging_path(&path);
        let written = write_file_synced(&*self.disk, &staging, &encode(&ranges))
            .and_then(|_| self.disk.rename(&staging, &path));
        written.map_err(|e| disk(format_args!("rewrite {}", path.display()), e))
    }
}

fn overlap(a: &IndexRange, b: &IndexRange) -> bool {
    a.start < b.end && b.start < a.end
}

/// `ranges` without the stripes of `cut`.
fn subtract(ranges: &[IndexRange], cut: IndexRange) -> Vec<IndexRange> {
    let mut left = Vec::with_capacity(ranges.len() + 1);
    for range in ranges {
        if !overlap(range, &cut) {
            left.push(*range);
            continue;
        }
        if range.start < cut.start {
            left.push(IndexRange::new(range.start, cut.start));
        }
        if cut.end < range.end {
            left.push(IndexRange::new(cut.end, range.end));
        }
    }
    left
}

/// A record's file name: `<file>.<token>.<start>-<end>`, or `<file>.<token>` for one named
/// before names carried its stripes.
fn name(file: FileId, token: u64, named: Option<IndexRange>) -> String {
    match named {
        Some(range) => format!("{file}.{token}.{}-{}", range.start, range.end),
        None => format!("{file}.{token}"),
    }
}

/// File, token and the stripes named, of a record's name (`None` for a staging name).
fn parse_name(name: &str) -> Option<(FileId, u64, Option<IndexRange>)> {
    let mut parts = name.split('.');
    let file = parts.next()?.parse().ok()?;
    let token = parts.next()?.parse().ok()?;
    let named = match parts.next() {
        None => None,
        Some(range) => {
            let (start, end) = range.split_once('-')?;
            let (start, end): (u64, u64) = (start.parse().ok()?, end.parse().ok()?);
            if start >= end {
                return None;
            }
            Some(IndexRange::new(start, end))
        }
    };
    parts.next().is_none().then_some((file, token, named))
}

fn encode(ranges: &[IndexRange]) -> Vec<u8> {
    let mut body = Vec::with_capacity(4 + 16 * ranges.len());
    body.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
    for range in ranges {
        body.extend_from_slice(&range.start.to_le_bytes());
        body.extend_from_slice(&range.end.to_le_bytes());
    }
    let mut bytes = Vec::with_capacity(12 + body.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&STALE_FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    bytes
}

fn decode(bytes: &[u8]) -> Option<Vec<IndexRange>> {
    if bytes.len() < HEADER_BYTES || bytes[..4] != MAGIC {
        return None;
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    if word(4) != STALE_FORMAT_VERSION || word(8) != crc32c::crc32c(&bytes[12..]) {
        return None;
    }
    let count = word(12) as usize;
    let rest = &bytes[HEADER_BYTES..];
    if count == 0 || count > RANGES_MAX || rest.len() != count * 16 {
        return None;
    }
    let long = |at: usize| u64::from_le_bytes(rest[at..at + 8].try_into().expect("8 bytes"));
    let ranges: Vec<IndexRange> = (0..count)
        .map(|i| IndexRange::new(long(16 * i), long(16 * i + 8)))
        .collect();
    ranges.iter().all(|r| !r.is_empty()).then_some(ranges)
}
