//! A receiver's log: messages by position, each with the hash chain of the prefix it ends.
//!
//! The log holds positions `start..end`; positions below `start` were UTO-delivered and
//! dropped. Per sender it keeps how many of its messages the whole log (dropped prefix
//! included) holds: a receiver appends a sender's messages only in FIFO order, so these
//! are always a prefix `0..count` of what the sender sent, which the assertions keep.

use crate::packet::{
    Entry, ImagePart, LogImage, RepairEntry, COUNT_LEN, IMAGE_ENTRY_OVERHEAD, PART_FIXED_LEN,
    REPAIR_ENTRY_OVERHEAD,
};
use crate::{MsgId, SenderId};
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};

/// One position of the log.
#[derive(Clone, Debug)]
pub struct LogEntry {
    /// The message's identity.
    pub id: MsgId,
    /// Its bytes.
    pub message: Bytes,
    /// Hash chain of the log up to and including this position.
    pub hash: u64,
    /// When it arrived, in the receiver's count of arrivals (its place in arrival order,
    /// should the leader's order set it aside).
    pub arrival: u64,
}

/// The hash chain: the hash of a prefix extended by one message.
pub fn chain(hash: u64, id: MsgId) -> u64 {
    let mut x = hash ^ mix(u64::from(id.sender.node.0) << 32 | u64::from(id.sender.incarnation));
    x = mix(x ^ mix(id.seq.wrapping_add(0x5851_F42D_4C95_7F2D)));
    mix(x)
}

/// SplitMix64's finalizer.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Counts messages per sender into a map a run of one sender's messages at a time: a
/// packet's messages come from one sender, and a map update per message was a
/// noticeable share of a 64-byte closed loop (two per message and node: the log's
/// forgotten prefix and the deliveries).
#[derive(Debug, Default)]
pub(crate) struct SenderRun(Option<(SenderId, u64)>);

impl SenderRun {
    /// One more message of `sender`; the run before goes into `counts` if it was another
    /// sender's.
    pub(crate) fn count(&mut self, sender: SenderId, counts: &mut BTreeMap<SenderId, u64>) {
        match &mut self.0 {
            Some((current, n)) if *current == sender => *n += 1,
            _ => {
                self.flush(counts);
                self.0 = Some((sender, 1));
            }
        }
    }

    /// Adds the run into `counts`.
    pub(crate) fn flush(&mut self, counts: &mut BTreeMap<SenderId, u64>) {
        if let Some((sender, n)) = self.0.take() {
            *counts.entry(sender).or_insert(0) += n;
        }
    }
}

/// Positions `start..end` of a receiver's order.
#[derive(Clone, Debug, Default)]
pub struct Log {
    start: u64,
    start_hash: u64,
    start_counts: BTreeMap<SenderId, u64>,
    entries: VecDeque<LogEntry>,
    counts: BTreeMap<SenderId, u64>,
}

impl Log {
    /// First retained position.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The next position.
    pub fn end(&self) -> u64 {
        self.start + self.entries.len() as u64
    }

    /// The hash chain of positions `0..position`, if the log can tell.
    pub fn hash_at(&self, position: u64) -> Option<u64> {
        if position == self.start {
            return Some(self.start_hash);
        }
        if position < self.start || position > self.end() {
            return None;
        }
        Some(self.entries[(position - self.start - 1) as usize].hash)
    }

    /// The entry at `position`, if retained.
    pub fn get(&self, position: u64) -> Option<&LogEntry> {
        let index = position.checked_sub(self.start)?;
        self.entries.get(usize::try_from(index).ok()?)
    }

    /// How many of `sender`'s messages the log holds (its next expected sequence number).
    pub fn count(&self, sender: SenderId) -> u64 {
        self.counts.get(&sender).copied().unwrap_or(0)
    }

    /// Per sender, its messages at positions `..position` (within the retained log).
    pub fn counts_at(&self, position: u64) -> BTreeMap<SenderId, u64> {
        assert!(
            position >= self.start && position <= self.end(),
            "{position} not retained"
        );
        let mut counts = self.start_counts.clone();
        for entry in self.entries.range(..(position - self.start) as usize) {
            *counts.entry(entry.id.sender).or_insert(0) += 1;
        }
        counts
    }

    /// Every sender's count.
    pub fn counts(&self) -> &BTreeMap<SenderId, u64> {
        &self.counts
    }

    /// Appends the next message of its sender; returns its position.
    pub fn append(&mut self, id: MsgId, message: Bytes) -> u64 {
        self.append_arrived(id, message, 0)
    }

    /// Appends the next message of its sender, the `arrival`-th to arrive; returns its
    /// position.
    pub fn append_arrived(&mut self, id: MsgId, message: Bytes, arrival: u64) -> u64 {
        let count = self.counts.entry(id.sender).or_insert(0);
        assert_eq!(*count, id.seq, "FIFO: {id:?} appended out of order");
        *count += 1;
        let hash = chain(self.hash_at(self.end()).expect("end is known"), id);
        self.entries.push_back(LogEntry {
            id,
            message,
            hash,
            arrival,
        });
        self.end() - 1
    }

    /// Drops positions `at..`, giving each sender's counts back.
    pub fn truncate(&mut self, at: u64) {
        assert!(
            at >= self.start,
            "truncate at {at} below start {}",
            self.start
        );
        while self.end() > at {
            let entry = self.entries.pop_back().expect("end > at >= start");
            let count = self.counts.get_mut(&entry.id.sender).expect("counted");
            assert_eq!(
                *count,
                entry.id.seq + 1,
                "FIFO: truncating a non-last message"
            );
            *count -= 1;
        }
    }

    /// Forgets positions below `below` (already delivered everywhere that matters).
    pub fn forget_below(&mut self, below: u64) {
        let mut run = SenderRun::default();
        while self.start < below && !self.entries.is_empty() {
            let entry = self.entries.pop_front().expect("not empty");
            run.count(entry.id.sender, &mut self.start_counts);
            self.start_hash = entry.hash;
            self.start += 1;
        }
        run.flush(&mut self.start_counts);
    }

    /// Positions `from..end` as an image (with the counts and hash at `from`).
    pub fn image(&self, from: u64) -> LogImage {
        let from = from.clamp(self.start, self.end());
        let start_counts = self.counts_at(from);
        LogImage {
            start: from,
            start_hash: self.hash_at(from).expect("from within the log"),
            start_counts: start_counts.into_iter().collect(),
            entries: self
                .entries
                .range((from - self.start) as usize..)
                .map(|entry| Entry {
                    id: entry.id,
                    message: entry.message.clone(),
                })
                .collect(),
        }
    }

    /// Positions `from..to` as parts of a view-change message, each with at most about
    /// `bytes_max` bytes of packet (at least one entry; one part without entries for an
    /// empty range). The split depends only on the entries and `bytes_max`, so that the same
    /// range split again gives the same parts (a missing part is sent again as it was).
    pub fn image_parts(&self, from: u64, to: u64, bytes_max: usize) -> Vec<ImagePart> {
        assert!(
            self.start <= from && from <= to && to <= self.end(),
            "parts {from}..{to} of a log holding {}..{}",
            self.start,
            self.end()
        );
        let start_counts: Vec<(SenderId, u64)> = self.counts_at(from).into_iter().collect();
        let budget = bytes_max.saturating_sub(PART_FIXED_LEN + COUNT_LEN * start_counts.len());
        let head = ImagePart {
            start: from,
            start_hash: self.hash_at(from).expect("from is retained"),
            start_counts,
            end: to,
            end_hash: self.hash_at(to).expect("to is retained"),
            first: from,
            entries: Vec::new(),
        };
        let mut parts = Vec::new();
        let mut part = head.clone();
        let mut bytes = 0;
        let range = (from - self.start) as usize..(to - self.start) as usize;
        for entry in self.entries.range(range) {
            let cost = IMAGE_ENTRY_OVERHEAD + entry.message.len();
            if !part.entries.is_empty() && bytes + cost > budget {
                let first = part.first + part.entries.len() as u64;
                parts.push(std::mem::replace(
                    &mut part,
                    ImagePart {
                        first,
                        ..head.clone()
                    },
                ));
                bytes = 0;
            }
            bytes += cost;
            part.entries.push(Entry {
                id: entry.id,
                message: entry.message.clone(),
            });
        }
        parts.push(part);
        parts
    }

    /// The log an image describes. `None` if it breaks FIFO (a hostile or corrupt image).
    pub fn from_image(image: &LogImage) -> Option<Log> {
        let start_counts: BTreeMap<SenderId, u64> = image.start_counts.iter().copied().collect();
        let mut log = Log {
            start: image.start,
            start_hash: image.start_hash,
            counts: start_counts.clone(),
            start_counts,
            entries: VecDeque::with_capacity(image.entries.len()),
        };
        for entry in &image.entries {
            if log.count(entry.id.sender) != entry.id.seq {
                return None;
            }
            log.append(entry.id, entry.message.clone());
        }
        Some(log)
    }

    /// Entries `from..` for a member's repair, up to about `bytes_max` bytes (at least
    /// one entry): the bytes of a message only if the member `lacks` it (it keeps what it
    /// held, in its log or set aside).
    pub fn repair_entries(
        &self,
        from: u64,
        lacks: impl Fn(MsgId) -> bool,
        bytes_max: usize,
    ) -> Vec<RepairEntry> {
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut position = from;
        while let Some(entry) = self.get(position) {
            let message = lacks(entry.id).then(|| entry.message.clone());
            let continues = out.last().is_some_and(|last: &RepairEntry| {
                last.id.sender == entry.id.sender && last.id.seq + 1 == entry.id.seq
            });
            let overhead = if continues { 4 } else { REPAIR_ENTRY_OVERHEAD };
            let cost = overhead + message.as_ref().map_or(0, Bytes::len);
            if !out.is_empty() && bytes + cost > bytes_max {
                break;
            }
            bytes += cost;
            out.push(RepairEntry {
                id: entry.id,
                message,
            });
            position += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeId;

    fn id(node: u16, seq: u64) -> MsgId {
        MsgId {
            sender: SenderId {
                node: NodeId(node),
                incarnation: 0,
            },
            seq,
        }
    }

    #[test]
    fn hash_chain_names_the_prefix() {
        let mut a = Log::default();
        let mut b = Log::default();
        a.append(id(0, 0), Bytes::new());
        a.append(id(1, 0), Bytes::new());
        b.append(id(1, 0), Bytes::new());
        b.append(id(0, 0), Bytes::new());
        assert_ne!(a.hash_at(2), b.hash_at(2));
        b.truncate(0);
        b.append(id(0, 0), Bytes::new());
        b.append(id(1, 0), Bytes::new());
        assert_eq!(a.hash_at(2), b.hash_at(2));
    }

    #[test]
    fn image_round_trips_after_forgetting() {
        let mut a = Log::default();
        for seq in 0..5 {
            a.append(id(0, seq), Bytes::from(vec![seq as u8]));
            a.append(id(1, seq), Bytes::new());
        }
        a.forget_below(3);
        let image = a.image(4);
        let b = Log::from_image(&image).unwrap();
        assert_eq!(b.end(), a.end());
        assert_eq!(b.hash_at(10), a.hash_at(10));
        assert_eq!(b.count(id(0, 0).sender), 5);
        assert_eq!(a.hash_at(2), None);
    }

    #[test]
    #[should_panic(expected = "FIFO")]
    fn out_of_fifo_order_is_refused() {
        let mut a = Log::default();
        a.append(id(0, 1), Bytes::new());
    }
}

#[cfg(test)]
mod repair_size_tests {
    use super::*;
    use crate::packet::{Body, Header, Packet};
    use crate::{Config, NodeId, Status};

    /// The UDP driver sends one packet per datagram: an ENTRIES packet of the default
    /// `repair_bytes_max` must fit 65,507 bytes whatever the messages' sizes (64 KiB did not,
    /// and a repair that is never sent stalls the member forever).
    #[test]
    fn default_repair_fits_one_datagram() {
        let config = Config::default();
        for message_bytes in [0, 1, 64, 1000, config.message_bytes_max()] {
            let mut log = Log::default();
            for seq in 0..2_000 {
                let sender = SenderId {
                    node: NodeId(0),
                    incarnation: 0,
                };
                log.append(MsgId { sender, seq }, Bytes::from(vec![7; message_bytes]));
            }
            let entries = log.repair_entries(0, |_| true, config.repair_bytes_max);
            let packet = Packet {
                header: Header {
                    from: NodeId(0),
                    incarnation: 0,
                    view: 0,
                    status: Status::Normal,
                    epoch: 0,
                },
                body: Body::Entries {
                    from: 0,
                    prev_hash: 0,
                    entries,
                },
            };
            let len = packet.encode().len();
            assert!(len <= 65_507, "{message_bytes}-byte messages: {len} bytes");
        }
    }
}
