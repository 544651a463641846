//! What a file may read back as: the acknowledged bytes, and for bytes an unacknowledged
//! (cancelled or failed) write touched, the values that write may have left.

use std::collections::BTreeMap;

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
}

impl FileModel {
    /// The size every acknowledged write has reached.
    pub fn size(&self) -> u64 {
        self.acked.len() as u64
    }

    /// The largest size the file may have.
    pub fn size_max(&self) -> u64 {
        self.size_max.max(self.size())
    }

    /// An acknowledged write.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let end = offset as usize + data.len();
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
    }

    /// A write that was not acknowledged: each byte may hold its old value or the new one.
    pub fn write_unacknowledged(&mut self, offset: u64, data: &[u8]) {
        self.size_max = self.size_max.max(offset + data.len() as u64);
        for (i, &byte) in data.iter().enumerate() {
            let values = self.maybe.entry(offset + i as u64).or_default();
            if !values.contains(&byte) {
                values.push(byte);
            }
        }
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
