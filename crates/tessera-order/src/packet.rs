//! The packet format: every datagram is one packet, a fixed header and a body by kind.
//!
//! The byte layout is in the crate documentation. [`decode`] never panics: it refuses
//! anything truncated, with trailing bytes, of another magic or version, with a wrong
//! checksum, longer than [`PACKET_BYTES_MAX`], or with a field outside its range, and what it
//! accepts encodes back to the same bytes (one packet, one encoding).

use crate::{GroupRecord, MsgId, NodeId, SenderId, Status};
use bytes::Bytes;

/// "TO": total order.
pub const MAGIC: u16 = 0x544F;
/// The version of this layout; checked first, so a later version may change all that follows.
pub const VERSION: u8 = 6;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 28;
/// Largest packet the decoder takes. Every packet the node makes fits one UDP datagram
/// (65,507 bytes) with the default `repair_bytes_max`: view-change messages go in parts
/// ([`ImagePart`]), as ENTRIES do; data, ACK and NACK packets fit one MTU.
pub const PACKET_BYTES_MAX: usize = 16 << 20;
/// Bytes of an [`Ack`] with no per-sender counts.
pub const ACK_FIXED_LEN: usize = 42;
/// Bytes of one per-sender count in an [`Ack`] or a [`LogImage`].
pub const COUNT_LEN: usize = 14;
/// Bytes of an [`ImagePart`] besides its per-sender counts and entries, with the 16 bytes
/// and the group record before it in a DO-VIEW-CHANGE or START-VIEW body.
pub const PART_FIXED_LEN: usize = 16 + GROUP_LEN + 8 + 8 + 2 + 8 + 8 + 8 + 4;
/// Bytes of an entry of an [`ImagePart`] besides its message.
pub const IMAGE_ENTRY_OVERHEAD: usize = 18;
/// Bytes a data packet spends per message besides the message itself.
pub const MESSAGE_OVERHEAD: usize = 12;
/// Bytes of a data packet's body besides its messages and its ACK.
pub const DATA_FIXED_LEN: usize = 3;
/// Bytes of an ENTRIES entry besides its message, at most: a run of its own (identity,
/// count) and its length.
pub const REPAIR_ENTRY_OVERHEAD: usize = REPAIR_RUN_LEN + 4;
/// Bytes of a run's header in ENTRIES: sender, first sequence number, count.
pub const REPAIR_RUN_LEN: usize = 16;

const OFFSET_CHECKSUM: usize = 20;

/// Why bytes are not a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Fewer bytes than the header or than a field needs.
    #[error("truncated packet")]
    Truncated,
    /// More bytes than the header and body declare.
    #[error("trailing bytes after the packet")]
    Trailing,
    /// Not our magic number.
    #[error("bad magic")]
    Magic,
    /// A version this code does not speak.
    #[error("unknown version {0}")]
    Version(u8),
    /// An unknown kind byte.
    #[error("unknown kind {0}")]
    Kind(u8),
    /// The checksum does not match.
    #[error("bad checksum")]
    Checksum,
    /// Longer than [`PACKET_BYTES_MAX`].
    #[error("packet of {0} bytes exceeds the maximum")]
    TooLong(usize),
    /// A field holds a value outside its range.
    #[error("field {0} out of range")]
    Field(&'static str),
}

/// What every packet says about its sender: also the heartbeat and the view announcement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The sending node.
    pub from: NodeId,
    /// The sending node's incarnation.
    pub incarnation: u32,
    /// The view the sender is in (or changing to).
    pub view: u64,
    /// The sender's status in that view.
    pub status: Status,
    /// The low byte of the newest group epoch the sender knows: a peer that knows a newer
    /// group tells it ([`Body::Group`]).
    pub epoch: u8,
}

/// A receiver's acknowledgement: its log in the header's view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    /// Entries in the log (the next position).
    pub len: u64,
    /// Hash chain of the whole log up to `len`: two logs with the same hash at one length
    /// hold the same messages at every position below it.
    pub hash: u64,
    /// Positions UTO-delivered by the acknowledging node.
    pub commit: u64,
    /// The view's members, one bit per node id.
    pub members: u64,
    /// Messages the acknowledging node sent in its incarnation, all before this ACK (0 if
    /// it is no sender): a receiver that lacks some of them lost them (in a FIFO network),
    /// even when no later message of that sender came yet.
    pub sent: u64,
    /// Per sender (latest incarnations only): what the acknowledging node delivered and
    /// holds of its messages.
    pub counts: Vec<SenderCounts>,
}

/// What an acknowledging receiver did with one sender's messages, FIFO prefixes of what
/// it sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenderCounts {
    /// The sender.
    pub sender: SenderId,
    /// How many the receiver UTO-delivered (the sender forgets those).
    pub delivered: u64,
    /// How many its log holds, in whatever order (they left the network: the sender's
    /// window; the leader leaves their bytes out of ENTRIES).
    pub held: u64,
}

/// Bytes of a [`SenderCounts`] in an ACK.
pub const SENDER_COUNTS_LEN: usize = 22;

/// One message at a position of a log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Who sent it, and its number in the sender's FIFO order.
    pub id: MsgId,
    /// The application's bytes.
    pub message: Bytes,
}

/// One position of the leader's order in ENTRIES: the message's identity, and its bytes
/// only where the member may lack them (it holds the others, in its log or held back).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairEntry {
    /// Who sent it, and its number in the sender's FIFO order.
    pub id: MsgId,
    /// The application's bytes, or `None`: the member holds them.
    pub message: Option<Bytes>,
}

/// Length field of a [`RepairEntry`] without bytes (no message is that long).
const ABSENT: u32 = u32::MAX;

/// A suffix of a log, as carried by view changes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LogImage {
    /// Position of the first entry.
    pub start: u64,
    /// Hash chain up to `start`.
    pub start_hash: u64,
    /// Per sender, its messages at positions below `start`.
    pub start_counts: Vec<(SenderId, u64)>,
    /// The entries from `start` on.
    pub entries: Vec<Entry>,
}

impl LogImage {
    /// The position after the last entry.
    pub fn end(&self) -> u64 {
        self.start + self.entries.len() as u64
    }
}

/// One packet's share of a [`LogImage`] (a view-change message's log): the whole image's
/// bounds and hashes, and its entries from `first` on. An image longer than one datagram
/// goes in several parts; the receiver puts them together and checks the whole against
/// `end_hash`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ImagePart {
    /// The whole image's first position.
    pub start: u64,
    /// Hash chain up to `start`.
    pub start_hash: u64,
    /// Per sender, its messages at positions below `start`.
    pub start_counts: Vec<(SenderId, u64)>,
    /// The position after the whole image's last entry.
    pub end: u64,
    /// Hash chain up to `end`: names the whole image.
    pub end_hash: u64,
    /// Position of this part's first entry (`start <= first`, `first + entries <= end`).
    pub first: u64,
    /// Entries `first..first + entries.len()`.
    pub entries: Vec<Entry>,
}

/// A packet's body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Messages of the sending node, numbered in its FIFO order, and its ACK if it receives.
    Data {
        /// Piggybacked acknowledgement.
        ack: Option<Ack>,
        /// `(sequence number, message)`.
        messages: Vec<(u64, Bytes)>,
    },
    /// A standalone acknowledgement.
    Ack(Ack),
    /// To a sender: retransmit your messages `from..to`.
    Nack {
        /// The sender (incarnation included) whose messages are missing.
        sender: SenderId,
        /// First missing sequence number.
        from: u64,
        /// One past the last.
        to: u64,
    },
    /// Nothing but the header: alive, in this view, with this status.
    Heartbeat,
    /// The leader's order for positions `from..`: replaces a follower's divergent suffix.
    Entries {
        /// Position of the first entry.
        from: u64,
        /// The leader's hash chain up to `from`.
        prev_hash: u64,
        /// The leader's entries.
        entries: Vec<RepairEntry>,
    },
    /// To the new view's leader: my state, and my promise to accept nothing in older views
    /// (one part of it: the log may take several packets).
    DoViewChange {
        /// The last view this node was a normal member of; `None` for a node that restarted
        /// and holds nothing.
        last_normal: Option<u64>,
        /// Positions this node UTO-delivered.
        commit: u64,
        /// The newest group it knows (the leader adopts a newer one before it chooses).
        group: GroupRecord,
        /// A part of its log, from about the first position some member had not delivered.
        part: ImagePart,
    },
    /// From the new view's leader: the view's members and its starting log (one part).
    StartView {
        /// One bit per member node id.
        members: u64,
        /// Positions known UTO-delivered by some node.
        commit: u64,
        /// The group the view runs.
        group: GroupRecord,
        /// A part of the view's log.
        part: ImagePart,
    },
    /// To the new leader (from a member) or to a voter (from the new leader): the
    /// START-VIEW or DO-VIEW-CHANGE of the header's view you sent me lacks the entries at
    /// positions `from..to`: send the parts that hold them.
    Missing {
        /// First position lacking (0 if no part arrived).
        from: u64,
        /// One past the last (`u64::MAX`: up to the end).
        to: u64,
    },
    /// To a member, from one that joined a view past positions it had not delivered: send
    /// positions `start..end` of your log, as parts of one image; I lack `from..to` of it.
    Fetch {
        /// First position of the image.
        start: u64,
        /// One past its last (the view's first position).
        end: u64,
        /// First position lacking.
        from: u64,
        /// One past the last lacking.
        to: u64,
    },
    /// The answer to [`Body::Fetch`]: a part of the image asked for.
    LogPart(ImagePart),
    /// The newest group the sender knows, to a node whose header named an older epoch.
    Group(GroupRecord),
}

/// One packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// Who sends, in which view.
    pub header: Header,
    /// What it says.
    pub body: Body,
}

const KIND_DATA: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_NACK: u8 = 3;
const KIND_HEARTBEAT: u8 = 4;
const KIND_ENTRIES: u8 = 5;
const KIND_DO_VIEW_CHANGE: u8 = 6;
const KIND_START_VIEW: u8 = 7;
const KIND_MISSING: u8 = 8;
const KIND_FETCH: u8 = 9;
const KIND_LOG_PART: u8 = 10;
const KIND_GROUP: u8 = 11;
/// Bytes of a [`GroupRecord`] in a packet.
pub const GROUP_LEN: usize = 28;

fn put_u16(out: &mut Vec<u8>, value: u16) {
    out.extend_from_slice(&value.to_be_bytes());
}
fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_be_bytes());
}
fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_be_bytes());
}

fn put_counts(out: &mut Vec<u8>, counts: &[(SenderId, u64)]) {
    put_u16(
        out,
        u16::try_from(counts.len()).expect("at most 65535 senders"),
    );
    for (sender, count) in counts {
        put_u16(out, sender.node.0);
        put_u32(out, sender.incarnation);
        put_u64(out, *count);
    }
}

fn put_group(out: &mut Vec<u8>, group: &GroupRecord) {
    assert!(group.receivers != 0 && group.previous_receivers != 0);
    put_u32(out, group.epoch);
    put_u64(out, group.senders);
    put_u64(out, group.receivers);
    put_u64(out, group.previous_receivers);
}

fn put_ack(out: &mut Vec<u8>, ack: &Ack) {
    put_u64(out, ack.len);
    put_u64(out, ack.hash);
    put_u64(out, ack.commit);
    put_u64(out, ack.members);
    put_u64(out, ack.sent);
    put_u16(
        out,
        u16::try_from(ack.counts.len()).expect("at most 65535 senders"),
    );
    for counts in &ack.counts {
        put_u16(out, counts.sender.node.0);
        put_u32(out, counts.sender.incarnation);
        put_u64(out, counts.delivered);
        put_u64(out, counts.held);
    }
}

fn put_entries(out: &mut Vec<u8>, entries: &[Entry]) {
    put_u32(out, u32::try_from(entries.len()).expect("entries fit u32"));
    for entry in entries {
        put_u16(out, entry.id.sender.node.0);
        put_u32(out, entry.id.sender.incarnation);
        put_u64(out, entry.id.seq);
        put_u32(
            out,
            u32::try_from(entry.message.len()).expect("message fits u32"),
        );
        out.extend_from_slice(&entry.message);
    }
}

/// Entries in runs of one sender's consecutive messages (the sequencer passes a DATA
/// packet's messages in a row): `n u32` runs, each `node u16, incarnation u32, seq u64,
/// count u16` and then each message's `len u32` (`u32::MAX`: no bytes) and bytes.
fn put_repair_entries(out: &mut Vec<u8>, entries: &[RepairEntry]) {
    let mut runs: Vec<&[RepairEntry]> = Vec::new();
    let mut start = 0;
    for i in 1..=entries.len() {
        let continues = i < entries.len()
            && entries[i].id.sender == entries[i - 1].id.sender
            && entries[i - 1].id.seq.checked_add(1) == Some(entries[i].id.seq)
            && i - start < usize::from(u16::MAX);
        if !continues {
            runs.push(&entries[start..i]);
            start = i;
        }
    }
    put_u32(out, u32::try_from(runs.len()).expect("runs fit u32"));
    for run in runs {
        let first = run[0].id;
        put_u16(out, first.sender.node.0);
        put_u32(out, first.sender.incarnation);
        put_u64(out, first.seq);
        put_u16(out, u16::try_from(run.len()).expect("a run fits u16"));
        for entry in run {
            put_repair_message(out, entry);
        }
    }
}

fn put_repair_message(out: &mut Vec<u8>, entry: &RepairEntry) {
    match &entry.message {
        Some(message) => {
            let len = u32::try_from(message.len()).expect("message fits u32");
            assert!(len != ABSENT, "message of u32::MAX bytes");
            put_u32(out, len);
            out.extend_from_slice(message);
        }
        None => put_u32(out, ABSENT),
    }
}

fn put_part(out: &mut Vec<u8>, part: &ImagePart) {
    let last = part.first.checked_add(part.entries.len() as u64);
    assert!(
        part.start <= part.first && last.is_some_and(|last| last <= part.end),
        "a part lies within its image"
    );
    put_u64(out, part.start);
    put_u64(out, part.start_hash);
    put_counts(out, &part.start_counts);
    put_u64(out, part.end);
    put_u64(out, part.end_hash);
    put_u64(out, part.first);
    put_entries(out, &part.entries);
}

/// Bytes an [`Ack`] takes in a packet.
pub fn ack_len(ack: &Ack) -> usize {
    ACK_FIXED_LEN + SENDER_COUNTS_LEN * ack.counts.len()
}

impl Packet {
    /// The packet's bytes, checksum sealed.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + 64);
        put_u16(&mut out, MAGIC);
        out.push(VERSION);
        out.push(self.kind());
        put_u16(&mut out, self.header.from.0);
        put_u32(&mut out, self.header.incarnation);
        put_u64(&mut out, self.header.view);
        out.push(self.header.status as u8);
        out.push(self.header.epoch);
        put_u32(&mut out, 0); // checksum, sealed below
        put_u32(&mut out, 0); // body length, written below
        self.encode_body(&mut out);
        let body_len = out.len() - HEADER_LEN;
        assert!(
            out.len() <= PACKET_BYTES_MAX,
            "packet of {} bytes",
            out.len()
        );
        out[24..28].copy_from_slice(&(body_len as u32).to_be_bytes());
        seal(&mut out);
        out
    }

    fn kind(&self) -> u8 {
        match self.body {
            Body::Data { .. } => KIND_DATA,
            Body::Ack(_) => KIND_ACK,
            Body::Nack { .. } => KIND_NACK,
            Body::Heartbeat => KIND_HEARTBEAT,
            Body::Entries { .. } => KIND_ENTRIES,
            Body::DoViewChange { .. } => KIND_DO_VIEW_CHANGE,
            Body::StartView { .. } => KIND_START_VIEW,
            Body::Missing { .. } => KIND_MISSING,
            Body::Fetch { .. } => KIND_FETCH,
            Body::LogPart(_) => KIND_LOG_PART,
            Body::Group(_) => KIND_GROUP,
        }
    }

    fn encode_body(&self, out: &mut Vec<u8>) {
        match &self.body {
            Body::Data { ack, messages } => {
                match ack {
                    Some(ack) => {
                        out.push(1);
                        put_ack(out, ack);
                    }
                    None => out.push(0),
                }
                put_u16(
                    out,
                    u16::try_from(messages.len()).expect("messages fit u16"),
                );
                for (seq, message) in messages {
                    put_u64(out, *seq);
                    put_u32(out, u32::try_from(message.len()).expect("message fits u32"));
                    out.extend_from_slice(message);
                }
            }
            Body::Ack(ack) => put_ack(out, ack),
            Body::Nack { sender, from, to } => {
                put_u16(out, sender.node.0);
                put_u32(out, sender.incarnation);
                put_u64(out, *from);
                put_u64(out, *to);
            }
            Body::Heartbeat => {}
            Body::Entries {
                from,
                prev_hash,
                entries,
            } => {
                put_u64(out, *from);
                put_u64(out, *prev_hash);
                put_repair_entries(out, entries);
            }
            Body::DoViewChange {
                last_normal,
                commit,
                group,
                part,
            } => {
                assert!(*last_normal != Some(u64::MAX), "view u64::MAX is reserved");
                put_u64(out, last_normal.unwrap_or(u64::MAX));
                put_u64(out, *commit);
                put_group(out, group);
                put_part(out, part);
            }
            Body::StartView {
                members,
                commit,
                group,
                part,
            } => {
                put_u64(out, *members);
                put_u64(out, *commit);
                put_group(out, group);
                put_part(out, part);
            }
            Body::Missing { from, to } => {
                assert!(from < to, "a missing range is not empty");
                put_u64(out, *from);
                put_u64(out, *to);
            }
            Body::Fetch {
                start,
                end,
                from,
                to,
            } => {
                assert!(
                    start <= from && from < to && to <= end,
                    "a fetched range is not empty and within its image"
                );
                for value in [start, end, from, to] {
                    put_u64(out, *value);
                }
            }
            Body::LogPart(part) => put_part(out, part),
            Body::Group(group) => put_group(out, group),
        }
    }
}

/// CRC32C of a packet with its checksum field taken as zero.
pub fn checksum(packet: &[u8]) -> u32 {
    assert!(packet.len() >= HEADER_LEN);
    let crc = crc32c::crc32c(&packet[..OFFSET_CHECKSUM]);
    let crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc32c::crc32c_append(crc, &packet[OFFSET_CHECKSUM + 4..])
}

/// A sealed packet's identity, for a node to know its own broadcasts when they come back:
/// the checksum its header carries (no second pass over its bytes); the CRC32C of anything
/// shorter than a header.
pub fn identity(packet: &[u8]) -> u32 {
    match packet.get(OFFSET_CHECKSUM..OFFSET_CHECKSUM + 4) {
        Some(field) if packet.len() >= HEADER_LEN => {
            u32::from_be_bytes(field.try_into().expect("4 bytes"))
        }
        _ => crc32c::crc32c(packet),
    }
}

/// Writes the checksum of a packet of at least [`HEADER_LEN`] bytes into it.
pub fn seal(packet: &mut [u8]) {
    let crc = checksum(packet);
    packet[OFFSET_CHECKSUM..OFFSET_CHECKSUM + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Reads fields off a byte slice, refusing to run past its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// The whole packet, copied once at the first message's bytes: every message of it is
    /// a slice of this copy (one allocation per packet, not one per message).
    shared: Option<Bytes>,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PacketError> {
        let end = self.at.checked_add(n).ok_or(PacketError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(PacketError::Truncated)?;
        self.at = end;
        Ok(slice)
    }
    fn u8(&mut self) -> Result<u8, PacketError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, PacketError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, PacketError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, PacketError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }
    fn bytes(&mut self, len: u32) -> Result<Bytes, PacketError> {
        let start = self.at;
        self.take(len as usize)?;
        let packet = self.bytes;
        let shared = self
            .shared
            .get_or_insert_with(|| Bytes::copy_from_slice(packet));
        Ok(shared.slice(start..self.at))
    }
    fn sender(&mut self) -> Result<SenderId, PacketError> {
        let node = NodeId(self.u16()?);
        let incarnation = self.u32()?;
        Ok(SenderId { node, incarnation })
    }
    /// A count of items of at least `item_min` bytes each: refused if the rest cannot hold
    /// them, so that no allocation follows a hostile count.
    fn count(&mut self, count: usize, item_min: usize) -> Result<usize, PacketError> {
        if count.saturating_mul(item_min) > self.remaining() {
            return Err(PacketError::Truncated);
        }
        Ok(count)
    }
    fn counts(&mut self) -> Result<Vec<(SenderId, u64)>, PacketError> {
        let raw = self.u16()? as usize;
        let n = self.count(raw, COUNT_LEN)?;
        let mut counts = Vec::with_capacity(n);
        for _ in 0..n {
            let sender = self.sender()?;
            counts.push((sender, self.u64()?));
        }
        Ok(counts)
    }
    fn ack(&mut self) -> Result<Ack, PacketError> {
        Ok(Ack {
            len: self.u64()?,
            hash: self.u64()?,
            commit: self.u64()?,
            members: self.u64()?,
            sent: self.u64()?,
            counts: self.sender_counts()?,
        })
    }
    fn sender_counts(&mut self) -> Result<Vec<SenderCounts>, PacketError> {
        let raw = self.u16()? as usize;
        let n = self.count(raw, SENDER_COUNTS_LEN)?;
        let mut counts = Vec::with_capacity(n);
        for _ in 0..n {
            counts.push(SenderCounts {
                sender: self.sender()?,
                delivered: self.u64()?,
                held: self.u64()?,
            });
        }
        Ok(counts)
    }
    fn repair_entries(&mut self) -> Result<Vec<RepairEntry>, PacketError> {
        let raw = self.u32()? as usize;
        let runs = self.count(raw, REPAIR_RUN_LEN)?;
        let mut entries: Vec<RepairEntry> = Vec::new();
        // The previous run's sender, next sequence number and length: a run that merely
        // continues it would have been encoded as part of it (one packet, one encoding).
        let mut previous: Option<(SenderId, Option<u64>, usize)> = None;
        for _ in 0..runs {
            let sender = self.sender()?;
            let first = self.u64()?;
            let raw = usize::from(self.u16()?);
            let n = self.count(raw, 4)?;
            // The last sequence number may be u64::MAX; one past it may not exist.
            let Some(last) = (n > 0).then(|| first.checked_add(n as u64 - 1)).flatten() else {
                return Err(PacketError::Field("run"));
            };
            if let Some((prev_sender, prev_next, prev_len)) = previous {
                let continues = prev_sender == sender && prev_next == Some(first);
                if continues && prev_len < usize::from(u16::MAX) {
                    return Err(PacketError::Field("run"));
                }
            }
            previous = Some((sender, last.checked_add(1), n));
            for seq in first..=last {
                let message = match self.u32()? {
                    ABSENT => None,
                    len => Some(self.bytes(len)?),
                };
                entries.push(RepairEntry {
                    id: MsgId { sender, seq },
                    message,
                });
            }
        }
        Ok(entries)
    }
    fn entries(&mut self) -> Result<Vec<Entry>, PacketError> {
        let raw = self.u32()? as usize;
        let n = self.count(raw, 18)?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let sender = self.sender()?;
            let seq = self.u64()?;
            let len = self.u32()?;
            entries.push(Entry {
                id: MsgId { sender, seq },
                message: self.bytes(len)?,
            });
        }
        Ok(entries)
    }
    fn group(&mut self) -> Result<GroupRecord, PacketError> {
        let group = GroupRecord {
            epoch: self.u32()?,
            senders: self.u64()?,
            receivers: self.u64()?,
            previous_receivers: self.u64()?,
        };
        if group.receivers == 0 || group.previous_receivers == 0 {
            return Err(PacketError::Field("group"));
        }
        Ok(group)
    }
    fn part(&mut self) -> Result<ImagePart, PacketError> {
        let start = self.u64()?;
        let start_hash = self.u64()?;
        let start_counts = self.counts()?;
        let end = self.u64()?;
        let end_hash = self.u64()?;
        let first = self.u64()?;
        let entries = self.entries()?;
        let last = first.checked_add(entries.len() as u64);
        if first < start || last.is_none_or(|last| last > end) {
            return Err(PacketError::Field("part"));
        }
        Ok(ImagePart {
            start,
            start_hash,
            start_counts,
            end,
            end_hash,
            first,
            entries,
        })
    }
}

/// Parses one packet; never panics.
pub fn decode(bytes: &[u8]) -> Result<Packet, PacketError> {
    if bytes.len() > PACKET_BYTES_MAX {
        return Err(PacketError::TooLong(bytes.len()));
    }
    let mut reader = Reader {
        bytes,
        at: 0,
        shared: None,
    };
    if reader.u16().map_err(|_| PacketError::Truncated)? != MAGIC {
        return Err(PacketError::Magic);
    }
    let version = reader.u8()?;
    if version != VERSION {
        return Err(PacketError::Version(version));
    }
    let kind = reader.u8()?;
    let from = NodeId(reader.u16()?);
    let incarnation = reader.u32()?;
    let view = reader.u64()?;
    let status = Status::from_byte(reader.u8()?).ok_or(PacketError::Field("status"))?;
    let epoch = reader.u8()?;
    let stored_checksum = reader.u32()?;
    let body_len = reader.u32()? as usize;
    if HEADER_LEN.checked_add(body_len) != Some(bytes.len()) {
        return Err(if HEADER_LEN + body_len > bytes.len() {
            PacketError::Truncated
        } else {
            PacketError::Trailing
        });
    }
    if checksum(bytes) != stored_checksum {
        return Err(PacketError::Checksum);
    }
    let header = Header {
        from,
        incarnation,
        view,
        status,
        epoch,
    };
    let body = decode_body(kind, &mut reader)?;
    if reader.remaining() != 0 {
        return Err(PacketError::Trailing);
    }
    Ok(Packet { header, body })
}

fn decode_body(kind: u8, reader: &mut Reader<'_>) -> Result<Body, PacketError> {
    Ok(match kind {
        KIND_DATA => {
            let ack = match reader.u8()? {
                0 => None,
                1 => Some(reader.ack()?),
                _ => return Err(PacketError::Field("ack flag")),
            };
            let raw = reader.u16()? as usize;
            let n = reader.count(raw, MESSAGE_OVERHEAD)?;
            let mut messages = Vec::with_capacity(n);
            for _ in 0..n {
                let seq = reader.u64()?;
                let len = reader.u32()?;
                messages.push((seq, reader.bytes(len)?));
            }
            Body::Data { ack, messages }
        }
        KIND_ACK => Body::Ack(reader.ack()?),
        KIND_NACK => {
            let sender = reader.sender()?;
            let from = reader.u64()?;
            let to = reader.u64()?;
            if from >= to {
                return Err(PacketError::Field("nack range"));
            }
            Body::Nack { sender, from, to }
        }
        KIND_HEARTBEAT => Body::Heartbeat,
        KIND_ENTRIES => {
            let from = reader.u64()?;
            let prev_hash = reader.u64()?;
            let entries = reader.repair_entries()?;
            if from.checked_add(entries.len() as u64).is_none() {
                return Err(PacketError::Field("from"));
            }
            Body::Entries {
                from,
                prev_hash,
                entries,
            }
        }
        KIND_DO_VIEW_CHANGE => {
            let last_normal = match reader.u64()? {
                u64::MAX => None,
                view => Some(view),
            };
            let commit = reader.u64()?;
            let group = reader.group()?;
            let part = reader.part()?;
            Body::DoViewChange {
                last_normal,
                commit,
                group,
                part,
            }
        }
        KIND_START_VIEW => {
            let members = reader.u64()?;
            let commit = reader.u64()?;
            let group = reader.group()?;
            let part = reader.part()?;
            Body::StartView {
                members,
                commit,
                group,
                part,
            }
        }
        KIND_MISSING => {
            let from = reader.u64()?;
            let to = reader.u64()?;
            if from >= to {
                return Err(PacketError::Field("missing range"));
            }
            Body::Missing { from, to }
        }
        KIND_FETCH => {
            let start = reader.u64()?;
            let end = reader.u64()?;
            let from = reader.u64()?;
            let to = reader.u64()?;
            if !(start <= from && from < to && to <= end) {
                return Err(PacketError::Field("fetch range"));
            }
            Body::Fetch {
                start,
                end,
                from,
                to,
            }
        }
        KIND_LOG_PART => Body::LogPart(reader.part()?),
        KIND_GROUP => Body::Group(reader.group()?),
        other => return Err(PacketError::Kind(other)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sender() -> impl Strategy<Value = SenderId> {
        (0u16..64, any::<u32>()).prop_map(|(node, incarnation)| SenderId {
            node: NodeId(node),
            incarnation,
        })
    }

    fn message() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from)
    }

    fn ack() -> impl Strategy<Value = Ack> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(
                (sender(), any::<u64>(), any::<u64>()).prop_map(|(sender, delivered, held)| {
                    SenderCounts {
                        sender,
                        delivered,
                        held,
                    }
                }),
                0..5,
            ),
        )
            .prop_map(|(len, hash, commit, members, counts)| Ack {
                len,
                hash,
                commit,
                members,
                sent: len ^ commit,
                counts,
            })
    }

    fn entries() -> impl Strategy<Value = Vec<Entry>> {
        proptest::collection::vec(
            (sender(), any::<u64>(), message()).prop_map(|(sender, seq, message)| Entry {
                id: MsgId { sender, seq },
                message,
            }),
            0..5,
        )
    }

    fn repair_entries() -> impl Strategy<Value = Vec<RepairEntry>> {
        proptest::collection::vec(
            (sender(), any::<u64>(), proptest::option::of(message())).prop_map(
                |(sender, seq, message)| RepairEntry {
                    id: MsgId { sender, seq },
                    message,
                },
            ),
            0..5,
        )
    }

    fn part() -> impl Strategy<Value = ImagePart> {
        (
            0u64..1 << 40,
            any::<u64>(),
            proptest::collection::vec((sender(), any::<u64>()), 0..4),
            (0u64..1000, 0u64..1000, any::<u64>()),
            entries(),
        )
            .prop_map(
                |(start, start_hash, start_counts, (skip, after, end_hash), entries)| {
                    let first = start + skip;
                    ImagePart {
                        start,
                        start_hash,
                        start_counts,
                        end: first + entries.len() as u64 + after,
                        end_hash,
                        first,
                        entries,
                    }
                },
            )
    }

    fn body() -> impl Strategy<Value = Body> {
        prop_oneof![
            (
                proptest::option::of(ack()),
                proptest::collection::vec((any::<u64>(), message()), 0..5)
            )
                .prop_map(|(ack, messages)| Body::Data { ack, messages }),
            ack().prop_map(Body::Ack),
            (sender(), 0u64..1000, 1u64..1000).prop_map(|(sender, from, len)| Body::Nack {
                sender,
                from,
                to: from + len
            }),
            Just(Body::Heartbeat),
            (0u64..1 << 40, any::<u64>(), repair_entries()).prop_map(
                |(from, prev_hash, entries)| {
                    Body::Entries {
                        from,
                        prev_hash,
                        entries,
                    }
                }
            ),
            (
                proptest::option::of(0u64..u64::MAX),
                any::<u64>(),
                group(),
                part()
            )
                .prop_map(|(last_normal, commit, group, part)| Body::DoViewChange {
                    last_normal,
                    commit,
                    group,
                    part
                }),
            (any::<u64>(), any::<u64>(), group(), part()).prop_map(
                |(members, commit, group, part)| {
                    Body::StartView {
                        members,
                        commit,
                        group,
                        part,
                    }
                }
            ),
            group().prop_map(Body::Group),
            (any::<u64>(), 1u64..u64::MAX).prop_map(|(from, len)| Body::Missing {
                from: from.min(u64::MAX - len),
                to: from.min(u64::MAX - len) + len
            }),
            (0u64..1 << 40, 0u64..1000, 1u64..1000, 0u64..1000).prop_map(
                |(start, skip, len, after)| Body::Fetch {
                    start,
                    end: start + skip + len + after,
                    from: start + skip,
                    to: start + skip + len,
                }
            ),
            part().prop_map(Body::LogPart),
        ]
    }

    fn group() -> impl Strategy<Value = GroupRecord> {
        (any::<u32>(), any::<u64>(), 1u64.., 1u64..).prop_map(
            |(epoch, senders, receivers, previous_receivers)| GroupRecord {
                epoch,
                senders,
                receivers,
                previous_receivers,
            },
        )
    }

    fn packet() -> impl Strategy<Value = Packet> {
        (
            0u16..64,
            any::<u32>(),
            any::<u64>(),
            0usize..4,
            any::<u8>(),
            body(),
        )
            .prop_map(|(from, incarnation, view, status, epoch, body)| Packet {
                header: Header {
                    from: NodeId(from),
                    incarnation,
                    view,
                    status: [
                        Status::Normal,
                        Status::ViewChange,
                        Status::Joining,
                        Status::Sender,
                    ][status],
                    epoch,
                },
                body,
            })
    }

    proptest! {
        #[test]
        fn decode_of_encode_is_identity(packet in packet()) {
            let bytes = packet.encode();
            prop_assert_eq!(decode(&bytes).unwrap(), packet);
        }

        #[test]
        fn decode_never_panics_and_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(packet) = decode(&bytes) {
                prop_assert_eq!(packet.encode(), bytes);
            }
        }

        #[test]
        fn a_flipped_bit_is_refused(packet in packet(), bit in any::<usize>()) {
            let mut bytes = packet.encode();
            let bit = bit % (bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode(&bytes).is_err());
        }

        #[test]
        fn sealed_garbage_never_panics(mut bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN..300)) {
            bytes[0..3].copy_from_slice(&[0x54, 0x4F, VERSION]);
            let body_len = (bytes.len() - HEADER_LEN) as u32;
            bytes[24..28].copy_from_slice(&body_len.to_be_bytes());
            seal(&mut bytes);
            if let Ok(packet) = decode(&bytes) {
                prop_assert_eq!(packet.encode(), bytes);
            }
        }
    }

    fn repair_packet(entries: Vec<RepairEntry>) -> Packet {
        Packet {
            header: Header {
                from: NodeId(1),
                incarnation: 2,
                view: 3,
                status: Status::Normal,
                epoch: 0,
            },
            body: Body::Entries {
                from: 4,
                prev_hash: 5,
                entries,
            },
        }
    }

    fn repair_entry(seq: u64) -> RepairEntry {
        RepairEntry {
            id: MsgId {
                sender: SenderId {
                    node: NodeId(7),
                    incarnation: 8,
                },
                seq,
            },
            message: Some(Bytes::from_static(b"m")),
        }
    }

    /// Found by the fuzzer (CI): two runs of one sender's consecutive messages are the
    /// encoding of one run, so the decoder must refuse them rather than accept a second
    /// encoding of the same packet.
    #[test]
    fn a_run_split_in_two_is_refused() {
        let bytes = repair_packet(vec![repair_entry(10), repair_entry(11)]).encode();
        let runs_at = HEADER_LEN + 8 + 8;
        assert_eq!(&bytes[runs_at..runs_at + 4], &1u32.to_be_bytes());
        // Rewrite as two runs of one: node, incarnation, seq, count 1, message; twice.
        let mut split = bytes[..runs_at].to_vec();
        put_u32(&mut split, 2);
        for seq in [10u64, 11] {
            put_u16(&mut split, 7);
            put_u32(&mut split, 8);
            put_u64(&mut split, seq);
            put_u16(&mut split, 1);
            put_u32(&mut split, 1);
            split.push(b'm');
        }
        let body_len = (split.len() - HEADER_LEN) as u32;
        split[24..28].copy_from_slice(&body_len.to_be_bytes());
        seal(&mut split);
        assert_eq!(decode(&split), Err(PacketError::Field("run")));
        // A gap in the sequence numbers makes two runs the one encoding.
        let gapped = repair_packet(vec![repair_entry(10), repair_entry(12)]);
        assert_eq!(decode(&gapped.encode()).unwrap(), gapped);
    }

    #[test]
    fn a_run_ending_at_the_last_sequence_number_round_trips() {
        let packet = repair_packet(vec![repair_entry(u64::MAX - 1), repair_entry(u64::MAX)]);
        assert_eq!(decode(&packet.encode()).unwrap(), packet);
    }

    #[test]
    fn truncations_are_refused() {
        let packet = Packet {
            header: Header {
                from: NodeId(3),
                incarnation: 1,
                view: 9,
                status: Status::Normal,
                epoch: 0,
            },
            body: Body::Data {
                ack: None,
                messages: vec![(0, Bytes::from_static(b"hello"))],
            },
        };
        let bytes = packet.encode();
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "{len}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(decode(&long), Err(PacketError::Trailing));
    }
}
