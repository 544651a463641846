//! Bytes as they are held elsewhere, without a copy: [`Pieces`] in order. A write's data
//! can be one buffer or pieces (an HTTP body as it arrived), which the write's requests gather
//! from directly; a read can hand its bytes out as pieces of the servers' answers
//! (`Client::read_open_blocks`).
//!
//! Why pieces: the S3 gateway copied each body piece into a chunk buffer, and the write then
//! copied the chunk's stripe units into each column's request (a column's units are not next
//! to each other in the chunk); the two copies were ~16% of the gateway's CPU on a 1 GiB PUT.
//! From pieces, a request's payload is gathered once, and parity is computed from the
//! gathered units. On a GET, copying each answer into a block before sending it was 15%.

use bytes::{Bytes, BytesMut};
use std::borrow::Cow;
use std::ops::Range;

/// Byte strings that, one after the other, are a write's data or a read's bytes.
#[derive(Debug, Clone, Default)]
pub struct Pieces {
    parts: Vec<Bytes>,
    /// Where each part ends, from the first part's start.
    ends: Vec<usize>,
}

impl Pieces {
    /// No bytes.
    pub fn new() -> Pieces {
        Pieces::default()
    }

    /// Appends `part` (an empty one is left out).
    pub fn push(&mut self, part: Bytes) {
        if part.is_empty() {
            return;
        }
        self.ends.push(self.len() + part.len());
        self.parts.push(part);
    }

    /// The bytes in all.
    pub fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// The parts, in order, taken out.
    pub fn into_parts(self) -> Vec<Bytes> {
        self.parts
    }

    /// The parts that `range` touches, each cut to it.
    fn slices(&self, range: Range<usize>) -> impl Iterator<Item = &[u8]> {
        assert!(
            range.end <= self.len(),
            "range {range:?} past {}",
            self.len()
        );
        // The first part ending after the range's start.
        let first = self.ends.partition_point(|&end| end <= range.start);
        let mut at = range.start;
        self.parts[first.min(self.parts.len())..]
            .iter()
            .zip(&self.ends[first.min(self.ends.len())..])
            .map_while(move |(part, &end)| {
                if at >= range.end {
                    return None;
                }
                let start = end - part.len();
                let slice = &part[at - start..range.end.min(end) - start];
                at += slice.len();
                Some(slice)
            })
    }
}

impl From<Bytes> for Pieces {
    fn from(bytes: Bytes) -> Pieces {
        let mut pieces = Pieces::new();
        pieces.push(bytes);
        pieces
    }
}

/// A write's data: borrowed from one buffer, or pieces.
#[derive(Clone, Copy)]
pub(crate) enum WriteData<'a> {
    Slice(&'a [u8]),
    Pieces(&'a Pieces),
}

impl<'a> WriteData<'a> {
    pub(crate) fn len(&self) -> usize {
        match self {
            WriteData::Slice(data) => data.len(),
            WriteData::Pieces(pieces) => pieces.len(),
        }
    }

    /// Appends the bytes in `range` to `out` (the one copy a request's payload costs).
    pub(crate) fn extend_into(&self, range: Range<usize>, out: &mut BytesMut) {
        match self {
            WriteData::Slice(data) => out.extend_from_slice(&data[range]),
            WriteData::Pieces(pieces) => {
                for slice in pieces.slices(range) {
                    out.extend_from_slice(slice);
                }
            }
        }
    }

    /// The bytes in `range` in one piece: borrowed where they lie in one, else gathered.
    pub(crate) fn gather(&self, range: Range<usize>) -> Cow<'a, [u8]> {
        match *self {
            WriteData::Slice(data) => Cow::Borrowed(&data[range]),
            WriteData::Pieces(pieces) => {
                let mut slices = pieces.slices(range.clone());
                let first = slices.next().unwrap_or(&[]);
                if first.len() == range.len() {
                    return Cow::Borrowed(first);
                }
                let mut joined = Vec::with_capacity(range.len());
                joined.extend_from_slice(first);
                slices.for_each(|slice| joined.extend_from_slice(slice));
                Cow::Owned(joined)
            }
        }
    }

    /// The bytes in `range` as a payload of their own (a copy).
    pub(crate) fn copied(&self, range: Range<usize>) -> Bytes {
        let mut out = BytesMut::with_capacity(range.len());
        self.extend_into(range, &mut out);
        out.freeze()
    }
}

/// `data` cut into pieces at `cuts` (each taken modulo its length plus one).
#[cfg(test)]
pub(crate) fn cut(data: &[u8], cuts: &[usize]) -> Pieces {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    points.extend([0, data.len()]);
    points.sort_unstable();
    let mut pieces = Pieces::new();
    for w in points.windows(2) {
        pieces.push(Bytes::copy_from_slice(&data[w[0]..w[1]]));
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_range_of_pieces_reads_as_the_same_range_of_one_buffer(
            data in prop::collection::vec(any::<u8>(), 0..2000),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
            a in any::<usize>(),
            b in any::<usize>(),
        ) {
            let pieces = cut(&data, &cuts);
            prop_assert_eq!(pieces.len(), data.len());
            let (a, b) = (a % (data.len() + 1), b % (data.len() + 1));
            let range = a.min(b)..a.max(b);
            let whole = WriteData::Slice(&data);
            let cut = WriteData::Pieces(&pieces);
            prop_assert_eq!(&*cut.gather(range.clone()), &data[range.clone()]);
            prop_assert_eq!(&*whole.gather(range.clone()), &data[range.clone()]);
            prop_assert_eq!(&cut.copied(range.clone())[..], &data[range.clone()]);
            let mut out = BytesMut::from(&b"head"[..]);
            cut.extend_into(range.clone(), &mut out);
            prop_assert_eq!(&out[4..], &data[range]);
        }
    }

    #[test]
    fn a_range_within_one_part_is_borrowed_and_one_across_parts_gathered() {
        let mut pieces = Pieces::new();
        pieces.push(Bytes::from_static(b"abcd"));
        pieces.push(Bytes::new());
        pieces.push(Bytes::from_static(b"efgh"));
        assert_eq!(pieces.parts().len(), 2, "the empty part is left out");
        let data = WriteData::Pieces(&pieces);
        assert!(matches!(data.gather(5..7), Cow::Borrowed(b"fg")));
        assert!(matches!(data.gather(4..8), Cow::Borrowed(b"efgh")));
        match data.gather(2..6) {
            Cow::Owned(joined) => assert_eq!(joined, b"cdef"),
            Cow::Borrowed(_) => panic!("a range across two parts cannot be borrowed"),
        }
        assert!(data.gather(3..3).is_empty());
    }
}
