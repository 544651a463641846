//! A message to send, as the application has it: one buffer, or a small head and a large body
//! (a frame's header and message, and its bulk payload) that are not joined in memory.
//!
//! Fragments are slices of the two parts, so that the payload is never copied on its way to
//! the socket. Only a fragment that straddles the seam is a copy, and the cut puts the seam in
//! the first fragment, the short one: a message of `n` fragments still takes `n` packets (the
//! count the receive budget expects), with every fragment after the first as large as the
//! path allows and cut out of the body. The wire does not change: a receiver appends
//! fragments of any size.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tessera_auth::{PacketMac, PayloadHash};

/// A message queued on a session: `head` then `body`, one after the other.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    head: Bytes,
    body: Bytes,
    /// Its fragments' payload hashes, if the sender made them ([`Message::hash_fragments`]).
    hashes: Option<Arc<FragmentHashes>>,
}

/// The payload hashes of a message's fragments, cut at one size.
#[derive(Debug, PartialEq, Eq)]
struct FragmentHashes {
    fragment_bytes_max: usize,
    hashes: Vec<PayloadHash>,
}

impl Message {
    /// The message that is `head` followed by `body`.
    pub fn new(head: Bytes, body: Bytes) -> Message {
        Message {
            head,
            body,
            hashes: None,
        }
    }

    /// Hashes its fragments' payloads under `mac`, cut at `fragment_bytes_max` (the
    /// session's, [`crate::Endpoint::sender_of`]): the per-byte part of their tags, done by
    /// the caller (a task or worker, on any thread) instead of the thread that sends them.
    /// The endpoint uses them only where the session's key and fragment size are these, so a
    /// stale guess costs only the time spent here.
    pub fn hash_fragments(&mut self, mac: &PacketMac, fragment_bytes_max: usize) {
        let bounds = self.fragment_bounds(fragment_bytes_max);
        let hashes = bounds
            .windows(2)
            .map(|piece| self.with_range(piece[0]..piece[1], |bytes| mac.payload_hash(bytes)))
            .collect();
        self.hashes = Some(Arc::new(FragmentHashes {
            fragment_bytes_max,
            hashes,
        }));
    }

    /// The payload hash of its fragment `index` when cut at `fragment_bytes_max`, if made.
    pub(crate) fn fragment_hash(
        &self,
        index: usize,
        fragment_bytes_max: usize,
    ) -> Option<PayloadHash> {
        let hashes = self.hashes.as_ref()?;
        if hashes.fragment_bytes_max != fragment_bytes_max {
            return None;
        }
        hashes.hashes.get(index).cloned()
    }

    /// `f` of the bytes in `range`, borrowed where they lie in one part.
    fn with_range<T>(&self, range: std::ops::Range<usize>, f: impl FnOnce(&[u8]) -> T) -> T {
        let seam = self.head.len();
        if range.end <= seam {
            f(&self.head[range])
        } else if range.start >= seam {
            f(&self.body[range.start - seam..range.end - seam])
        } else {
            f(&self.range(range))
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The message as one buffer (a copy, unless it has a single part).
    pub fn to_bytes(&self) -> Bytes {
        if self.body.is_empty() {
            return self.head.clone();
        }
        if self.head.is_empty() {
            return self.body.clone();
        }
        self.range(0..self.len())
    }

    /// Where its fragments of at most `fragment_bytes_max` start, and its end: a message of
    /// one part is cut into full fragments and a shorter last one; one with a body into a
    /// shorter first fragment (holding the seam) and full ones, the same number in all.
    pub(crate) fn fragment_bounds(&self, fragment_bytes_max: usize) -> Vec<usize> {
        assert!(fragment_bytes_max >= 1);
        let len = self.len();
        let count = len.div_ceil(fragment_bytes_max).max(1);
        let first = if self.head.is_empty() || self.body.is_empty() {
            fragment_bytes_max.min(len)
        } else {
            len - (count - 1) * fragment_bytes_max
        };
        let mut bounds = vec![0];
        let mut end = first;
        while bounds.len() <= count {
            bounds.push(end.min(len));
            end += fragment_bytes_max;
        }
        assert_eq!(*bounds.last().expect("one bound at least"), len);
        bounds
    }

    /// The bytes in `range`: a slice of one part, or a copy where it straddles the seam.
    pub(crate) fn range(&self, range: std::ops::Range<usize>) -> Bytes {
        let seam = self.head.len();
        if range.end <= seam {
            return self.head.slice(range);
        }
        if range.start >= seam {
            return self.body.slice(range.start - seam..range.end - seam);
        }
        let mut joined = BytesMut::with_capacity(range.len());
        joined.extend_from_slice(&self.head[range.start..]);
        joined.extend_from_slice(&self.body[..range.end - seam]);
        joined.freeze()
    }
}

impl From<Bytes> for Message {
    fn from(bytes: Bytes) -> Message {
        Message::new(bytes, Bytes::new())
    }
}

impl From<Vec<u8>> for Message {
    fn from(bytes: Vec<u8>) -> Message {
        Message::from(Bytes::from(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fragments(message: &Message, fragment_bytes_max: usize) -> Vec<Bytes> {
        let bounds = message.fragment_bounds(fragment_bytes_max);
        bounds
            .windows(2)
            .map(|w| message.range(w[0]..w[1]))
            .collect()
    }

    proptest! {
        #[test]
        fn fragments_make_the_message_in_as_many_packets_as_one_buffer_would(
            head in prop::collection::vec(any::<u8>(), 0..300),
            body in prop::collection::vec(any::<u8>(), 0..3000),
            fragment_bytes_max in 1usize..1500,
        ) {
            let whole: Vec<u8> = head.iter().chain(&body).copied().collect();
            let message = Message::new(Bytes::from(head), Bytes::from(body.clone()));
            let pieces = fragments(&message, fragment_bytes_max);
            prop_assert_eq!(pieces.concat(), whole.clone());
            prop_assert_eq!(pieces.len(), whole.len().div_ceil(fragment_bytes_max).max(1));
            prop_assert!(pieces.iter().all(|p| p.len() <= fragment_bytes_max));
            // Only the last may be empty (an empty message), and every one after the first
            // is full but the last.
            prop_assert!(pieces.iter().take(pieces.len() - 1).all(|p| !p.is_empty()));
            if pieces.len() > 2 {
                prop_assert!(pieces[1..pieces.len() - 1].iter().all(|p| p.len() == fragment_bytes_max));
            }
            prop_assert_eq!(message.to_bytes(), Bytes::from(whole));
        }
    }

    #[test]
    fn a_body_behind_a_small_head_is_sliced_not_copied() {
        let body = Bytes::from(vec![7u8; 10_000]);
        let message = Message::new(Bytes::from(vec![1u8; 40]), body.clone());
        let pieces = fragments(&message, 1000);
        assert_eq!(pieces.len(), 11);
        assert_eq!(pieces[0].len(), 40);
        for piece in &pieces[1..] {
            // A slice of the body shares its memory.
            let offset = piece.as_ptr() as usize - body.as_ptr() as usize;
            assert!(offset + piece.len() <= body.len());
        }
    }
}
