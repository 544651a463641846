//! What a file may read back as: the acknowledged bytes, and for bytes an unacknowledged
//! (cancelled or failed) write touched, the values that write may have left.

use std::collections::{BTreeMap, BTreeSet};

/// Which stripes an interrupted full-stripe write may leave unreadable, for a parity scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TornStripes {
    /// Bytes per stripe (data units only).
    pub stripe_bytes: u64,
    /// Whether an acknowledged partial-stripe write resolves the stripe (RAID-4/5: its
    /// read-modify-write resolves the stale parity under the lock first; Hybrid partial
    /// writes go to overflow and leave it).
    pub resolved_by_partial_writes: bool,
}

/// One file's model.
#[derive(Debug, Clone, Default)]
pub struct FileModel {
    /// Bytes as the last acknowledged write of each left them (zeros never written).
    acked: Vec<u8>,
    /// Other values a byte may hold: those of unacknowledged writes since the last
    /// acknowledged write of that byte.
    maybe: BTreeMap<u64, Vec<u8>>,
    /// Largest size an unacknowledged write may have given the file.
    size_max: u64,
    /// Smallest size an unacknowledged truncation may have left, if below the acknowledged
    /// size.
    size_floor: Option<u64>,
    /// For parity schemes: the rule of stripes left torn.
    torn_rule: Option<TornStripes>,
    /// Stripes an unacknowledged write covered whole (a full-stripe write that may have been
    /// cut short, leaving a stale-parity record) and no acknowledged write has resolved
    /// since: with a column lost, their bytes may read as an error (never as wrong bytes).
    torn: BTreeSet<u64>,
    /// Every write in order (acknowledged or not), to name the one a wrong read came from.
    history: Vec<Written>,
    /// What the file held when a sync of it was last acknowledged (`None`: never synced).
    synced: Option<Synced>,
    /// Byte ranges truncations cut since that sync.
    cut_since_sync: Vec<(u64, u64)>,
}

/// The model as a sync of the file left it.
#[derive(Debug, Clone, Default)]
struct Synced {
    acked: Vec<u8>,
    maybe: BTreeMap<u64, Vec<u8>>,
    /// Writes in `history` before the sync.
    writes: usize,
}

/// One write the model saw, kept to explain a mismatch.
#[derive(Debug, Clone)]
struct Written {
    offset: u64,
    data: Vec<u8>,
    acknowledged: bool,
}

/// A byte read back that the model does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Offset in the file.
    pub offset: u64,
    /// What was read.
    pub got: u8,
    /// What an acknowledged write left there.
    pub acked: u8,
    /// Whether only that value is allowed (no unacknowledged write touched the byte).
    pub acknowledged: bool,
    /// Bytes of the read that differ from the model.
    pub wrong_bytes: u64,
    /// Of those, bytes no unacknowledged write touched: acknowledged bytes lost.
    pub wrong_acknowledged: u64,
    /// The writes (numbered from 0 among this file's writes) whose bytes at `offset` match
    /// the 16 read from there, where the wrong bytes came from ("" if none).
    pub origin: Box<str>,
}

impl FileModel {
    /// A file of a parity scheme (see [`TornStripes`]).
    pub fn with_torn_stripes(rule: TornStripes) -> FileModel {
        FileModel {
            torn_rule: Some(rule),
            ..FileModel::default()
        }
    }

    /// Whether `stripe` may be left torn by an interrupted full-stripe write: reading it may
    /// fail while a column is lost.
    pub fn may_be_torn(&self, stripe: u64) -> bool {
        self.torn.contains(&stripe)
    }

    /// Whether an unacknowledged write may have left any byte of `offset..offset+len` other
    /// than as acknowledged.
    pub fn may_differ(&self, offset: u64, len: u64) -> bool {
        self.maybe.range(offset..offset + len).next().is_some()
    }

    /// Stripes that may be torn.
    pub fn torn_stripes(&self) -> usize {
        self.torn.len()
    }

    /// The stripes `offset..offset+len` covers whole, and those it covers in part.
    fn stripes_of(rule: &TornStripes, offset: u64, len: u64) -> (Vec<u64>, Vec<u64>) {
        let unit = rule.stripe_bytes;
        let end = offset + len;
        let (mut whole, mut part) = (Vec::new(), Vec::new());
        if len == 0 {
            return (whole, part);
        }
        for stripe in offset / unit..=(end - 1) / unit {
            if offset <= stripe * unit && (stripe + 1) * unit <= end {
                whole.push(stripe);
            } else {
                part.push(stripe);
            }
        }
        (whole, part)
    }

    /// The size every acknowledged write has reached.
    pub fn size(&self) -> u64 {
        self.acked.len() as u64
    }

    /// The smallest size the file may have (below [`size`](Self::size) after a truncation
    /// that was not acknowledged).
    pub fn size_min(&self) -> u64 {
        self.size_floor
            .map_or(self.size(), |floor| floor.min(self.size()))
    }

    /// An acknowledged truncation to `size`: the size is exactly that now, and every byte
    /// past it reads as zero if the file grows again (values unacknowledged writes left past
    /// the old size may stay: a truncation clears what the file held).
    pub fn truncate(&mut self, size: u64) {
        let old = self.size();
        if size < old {
            self.cut_since_sync.push((size, old));
        }
        let cut: Vec<u64> = self
            .maybe
            .range(size..old.max(size))
            .map(|(&o, _)| o)
            .collect();
        for o in cut {
            self.maybe.remove(&o);
        }
        if let Some(rule) = self.torn_rule {
            // Stripes inside what was cut were discarded or zeroed whole.
            let sb = rule.stripe_bytes;
            self.torn
                .retain(|&s| !(s * sb >= size && (s + 1) * sb <= old));
        }
        self.acked.resize(size as usize, 0);
        self.size_max = size;
        self.size_floor = None;
    }

    /// A truncation to `size` that was not acknowledged: the size may be that or the old one,
    /// each byte cut may be zero or its old value, and (parity schemes) the stripes from the
    /// first one wholly cut may be torn (a discard interrupted between columns).
    pub fn truncate_unacknowledged(&mut self, size: u64) {
        if size >= self.size() {
            self.size_max = self.size_max.max(size);
            return;
        }
        self.cut_since_sync.push((size, self.size()));
        for at in size..self.size() {
            let values = self.maybe.entry(at).or_default();
            if !values.contains(&0) {
                values.push(0);
            }
        }
        self.size_floor = Some(self.size_min().min(size));
        if let Some(rule) = self.torn_rule {
            let sb = rule.stripe_bytes;
            self.torn
                .extend(size.div_ceil(sb)..self.size_max().div_ceil(sb));
        }
    }

    /// The largest size the file may have.
    pub fn size_max(&self) -> u64 {
        self.size_max.max(self.size())
    }

    /// A sync of the file was acknowledged: what it holds now survives a power loss.
    pub fn synced(&mut self) {
        self.synced = Some(Synced {
            acked: self.acked.clone(),
            maybe: self.maybe.clone(),
            writes: self.history.len(),
        });
        self.cut_since_sync.clear();
    }

    /// Every server holding the file lost power with nothing left to rebuild it from, and the
    /// rebuild put back what they kept (`tessera-client`'s `restore` module): each byte
    /// written or cut since the last sync may read as it was then, or as any value written
    /// since (a power loss keeps, drops or tears each write not synced).
    pub fn unsynced_may_be_lost(&mut self) {
        let synced = self.synced.clone().unwrap_or_default();
        let mut allowed: Vec<(u64, u8)> = Vec::new();
        let then = |at: u64| {
            let mut values = vec![synced.acked.get(at as usize).copied().unwrap_or(0)];
            values.extend(synced.maybe.get(&at).into_iter().flatten());
            values
        };
        for written in &self.history[synced.writes.min(self.history.len())..] {
            for (i, &byte) in written.data.iter().enumerate() {
                let at = written.offset + i as u64;
                allowed.push((at, byte));
                allowed.extend(then(at).into_iter().map(|value| (at, value)));
            }
        }
        for &(from, to) in &self.cut_since_sync {
            for at in from..to {
                allowed.extend(then(at).into_iter().map(|value| (at, value)));
            }
        }
        for (at, value) in allowed {
            if self.acked_at(at) == value && !self.maybe.contains_key(&at) {
                continue;
            }
            let values = self.maybe.entry(at).or_default();
            if !values.contains(&value) {
                values.push(value);
            }
        }
    }

    /// An acknowledged write.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.remember(offset, data, true);
        let end = offset as usize + data.len();
        if let Some(floor) = &mut self.size_floor {
            *floor = (*floor).max(end as u64);
        }
        if self.acked.len() < end {
            self.acked.resize(end, 0);
        }
        self.acked[offset as usize..end].copy_from_slice(data);
        let touched: Vec<u64> = self
            .maybe
            .range(offset..end as u64)
            .map(|(&o, _)| o)
            .collect();
        for o in touched {
            self.maybe.remove(&o);
        }
        if let Some(rule) = self.torn_rule {
            let (whole, part) = Self::stripes_of(&rule, offset, data.len() as u64);
            for stripe in whole {
                self.torn.remove(&stripe);
            }
            if rule.resolved_by_partial_writes {
                for stripe in part {
                    self.torn.remove(&stripe);
                }
            }
        }
    }

    /// A write that was not acknowledged: each byte may hold its old value or the new one.
    pub fn write_unacknowledged(&mut self, offset: u64, data: &[u8]) {
        self.remember(offset, data, false);
        self.size_max = self.size_max.max(offset + data.len() as u64);
        for (i, &byte) in data.iter().enumerate() {
            let values = self.maybe.entry(offset + i as u64).or_default();
            if !values.contains(&byte) {
                values.push(byte);
            }
        }
        if let Some(rule) = self.torn_rule {
            let (whole, _) = Self::stripes_of(&rule, offset, data.len() as u64);
            self.torn.extend(whole);
        }
    }

    fn remember(&mut self, offset: u64, data: &[u8], acknowledged: bool) {
        self.history.push(Written {
            offset,
            data: data.to_vec(),
            acknowledged,
        });
    }

    /// The writes whose bytes at `offset` are `got` (a prefix of up to 16 bytes).
    fn origin(&self, offset: u64, got: &[u8]) -> Box<str> {
        let got = &got[..got.len().min(16)];
        let end = offset + got.len() as u64;
        let matches = |w: &Written| {
            let at = offset.checked_sub(w.offset)? as usize;
            (end <= w.offset + w.data.len() as u64 && w.data[at..at + got.len()] == *got)
                .then_some(())
        };
        let found: Vec<String> = self
            .history
            .iter()
            .enumerate()
            .filter(|(_, w)| matches(w).is_some())
            .map(|(n, w)| {
                let ack = if w.acknowledged {
                    "acknowledged"
                } else {
                    "unacknowledged"
                };
                format!("write {n} ({ack}, {}+{})", w.offset, w.data.len())
            })
            .collect();
        found.join(", ").into()
    }

    /// The acknowledged value of one byte (zero past the acknowledged size).
    fn acked_at(&self, offset: u64) -> u8 {
        self.acked.get(offset as usize).copied().unwrap_or(0)
    }

    /// Check bytes read at `offset`: the first one not allowed, with the count of all such.
    pub fn check(&self, offset: u64, got: &[u8]) -> Result<(), Mismatch> {
        let mut first: Option<Mismatch> = None;
        let (mut wrong, mut wrong_acknowledged) = (0, 0);
        for (i, &byte) in got.iter().enumerate() {
            let at = offset + i as u64;
            let acked = self.acked_at(at);
            let others = self.maybe.get(&at);
            if byte == acked || others.is_some_and(|v| v.contains(&byte)) {
                continue;
            }
            wrong += 1;
            wrong_acknowledged += u64::from(others.is_none());
            first.get_or_insert(Mismatch {
                offset: at,
                got: byte,
                acked,
                acknowledged: others.is_none(),
                wrong_bytes: 0,
                wrong_acknowledged: 0,
                origin: self.origin(at, &got[i..]),
            });
        }
        match first {
            None => Ok(()),
            Some(m) => Err(Mismatch {
                wrong_bytes: wrong,
                wrong_acknowledged,
                ..m
            }),
        }
    }
}
