//! Putting a view-change message back together from its parts.
//!
//! A DO-VIEW-CHANGE or START-VIEW carries a log, which under load is far longer than one
//! datagram; it goes as [`ImagePart`]s of at most `repair_bytes_max` bytes each. Each part
//! repeats what the whole message says besides its entries (two numbers, the image's bounds
//! and its hashes), so that parts of one message are told from parts of another, and the
//! receiver keeps them in an [`Assembly`] until they cover the image. The whole is checked
//! against the hash chain at its end before anyone uses it.

use crate::log::Log;
use crate::packet::{Entry, ImagePart, LogImage};
use crate::Micros;
use std::collections::BTreeMap;

/// Parts kept for one message at most (with the default `repair_bytes_max`, 240 MiB of log):
/// a limit against a confused peer, far above any log the window lets grow.
pub const ASSEMBLY_PARTS_MAX: usize = 1 << 12;

/// The parts of one view-change message received so far.
#[derive(Debug)]
pub struct Assembly {
    /// The numbers before the part in the body (last normal view and commit, or members and
    /// commit), which every part repeats.
    pub head: (u64, u64),
    /// The image's bounds and hashes (entries empty).
    bounds: ImagePart,
    /// Entries by the position of their part's first.
    parts: BTreeMap<u64, Vec<Entry>>,
    /// When the last part arrived.
    pub last_part_at: Micros,
}

impl Assembly {
    /// An assembly that begins with `part`.
    pub fn new(head: (u64, u64), part: ImagePart, now: Micros) -> Assembly {
        let mut assembly = Assembly {
            head,
            bounds: ImagePart {
                entries: Vec::new(),
                ..part.clone()
            },
            parts: BTreeMap::new(),
            last_part_at: now,
        };
        assembly.add(part, now);
        assembly
    }

    /// Whether `part` belongs to this message.
    pub fn matches(&self, head: (u64, u64), part: &ImagePart) -> bool {
        let bounds = &self.bounds;
        head == self.head
            && part.start == bounds.start
            && part.start_hash == bounds.start_hash
            && part.end == bounds.end
            && part.end_hash == bounds.end_hash
            && part.start_counts == bounds.start_counts
    }

    /// Keeps a part of this message (a repeated one replaces its copy).
    pub fn add(&mut self, part: ImagePart, now: Micros) {
        self.last_part_at = now;
        if self.parts.len() < ASSEMBLY_PARTS_MAX || self.parts.contains_key(&part.first) {
            self.parts.insert(part.first, part.entries);
        }
    }

    /// The first range of positions no part holds, if any.
    pub fn missing(&self) -> Option<(u64, u64)> {
        let mut position = self.bounds.start;
        while position < self.bounds.end {
            match self.parts.get(&position) {
                Some(entries) if !entries.is_empty() => position += entries.len() as u64,
                _ => {
                    let next = self.parts.range(position + 1..).next();
                    let to = next.map_or(self.bounds.end, |(&first, _)| first);
                    return Some((position, to.min(self.bounds.end)));
                }
            }
        }
        None
    }

    /// The whole image, once every position arrived and the hash chain over it ends at the
    /// message's `end_hash`; `Err` if complete but inconsistent (the caller drops it).
    pub fn image(&self) -> Option<Result<LogImage, ()>> {
        if self.missing().is_some() {
            return None;
        }
        let mut entries = Vec::with_capacity((self.bounds.end - self.bounds.start) as usize);
        let mut position = self.bounds.start;
        while position < self.bounds.end {
            let part = &self.parts[&position];
            entries.extend(part.iter().cloned());
            position += part.len() as u64;
        }
        let image = LogImage {
            start: self.bounds.start,
            start_hash: self.bounds.start_hash,
            start_counts: self.bounds.start_counts.clone(),
            entries,
        };
        let consistent = Log::from_image(&image)
            .is_some_and(|log| log.hash_at(self.bounds.end) == Some(self.bounds.end_hash));
        Some(if consistent { Ok(image) } else { Err(()) })
    }
}

/// The parts among `parts` that hold positions of `from..to` (the one part of an empty
/// image always), at most `count`.
pub fn parts_within(parts: Vec<ImagePart>, from: u64, to: u64, count: usize) -> Vec<ImagePart> {
    parts
        .into_iter()
        .filter(|part| {
            let last = part.first + part.entries.len() as u64;
            part.first < to && (last > from || part.entries.is_empty())
        })
        .take(count)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MsgId, NodeId, SenderId};
    use bytes::Bytes;

    fn log(messages: u64, message_bytes: usize) -> Log {
        let mut log = Log::default();
        for seq in 0..messages {
            let sender = SenderId {
                node: NodeId((seq % 3) as u16),
                incarnation: 1,
            };
            let id = MsgId {
                sender,
                seq: seq / 3,
            };
            log.append(id, Bytes::from(vec![seq as u8; message_bytes]));
        }
        log
    }

    #[test]
    fn parts_in_any_order_give_back_the_image() {
        let log = log(2_000, 100);
        let parts = log.image_parts(300, 2_000, 10_000);
        assert!(parts.len() > 10, "{} parts", parts.len());
        let mut assembly = Assembly::new((1, 2), parts[parts.len() - 1].clone(), 0);
        for (i, part) in parts.iter().enumerate().rev().skip(1) {
            assert!(assembly.matches((1, 2), part));
            assert!(assembly.image().is_none(), "complete before part {i}");
            assembly.add(part.clone(), 1);
        }
        let image = assembly.image().unwrap().unwrap();
        assert_eq!(image, log.image(300));
    }

    #[test]
    fn a_lost_part_is_named_and_sent_again_alike() {
        let log = log(1_000, 50);
        let parts = log.image_parts(0, 1_000, 5_000);
        let mut assembly = Assembly::new((0, 0), parts[0].clone(), 0);
        for part in &parts[2..] {
            assembly.add(part.clone(), 0);
        }
        let (from, to) = assembly.missing().unwrap();
        assert_eq!((from, to), (parts[1].first, parts[2].first));
        let again = parts_within(log.image_parts(0, 1_000, 5_000), from, to, 16);
        assert_eq!(again, vec![parts[1].clone()]);
        assembly.add(again[0].clone(), 1);
        assert_eq!(assembly.image().unwrap().unwrap(), log.image(0));
    }

    #[test]
    fn an_inconsistent_whole_is_refused_and_an_empty_image_is_one_part() {
        let log = log(100, 10);
        let mut parts = log.image_parts(0, 100, 500);
        parts[1].entries.swap(0, 1);
        let mut assembly = Assembly::new((0, 0), parts[0].clone(), 0);
        for part in &parts[1..] {
            assembly.add(part.clone(), 0);
        }
        assert_eq!(assembly.image(), Some(Err(())));
        let empty = log.image_parts(100, 100, 500);
        assert_eq!(empty.len(), 1);
        let assembly = Assembly::new((0, 0), empty[0].clone(), 0);
        assert_eq!(assembly.image().unwrap().unwrap().entries.len(), 0);
        assert_eq!(parts_within(empty, 0, u64::MAX, 16).len(), 1);
    }

    #[test]
    fn every_part_fits_its_budget() {
        let log = log(3_000, 1_000);
        for part in log.image_parts(0, 3_000, 60 << 10) {
            let bytes: usize = part.entries.iter().map(|e| 18 + e.message.len()).sum();
            assert!(bytes + crate::packet::PART_FIXED_LEN + 14 * 3 <= 60 << 10);
        }
    }
}
