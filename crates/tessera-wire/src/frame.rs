//! The frame: header, message, payload.

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};

/// Version of the wire protocol; a frame of any other version is refused. Version 2: parity
/// locks carry fencing tokens and intent records (`RecordIntent`, `RenewParity`,
/// `ReadIntent`, `Locked`, `Intent`, `StaleLock`, `LockBusy`). Version 3: every connection
/// opens with a [`crate::Handshake`]. Version 4: stale-parity records of full-stripe writes
/// (`RecordStale`, `RenewStale`, `ClearStale`, `StaleRecorded`, `stale` in `Locked` and
/// `Intent`). Version 5: `ReadIntent` waits out a live stale-parity record (`waited` in
/// `Intent`). Version 6: `Intent` carries the stripe's `generation`, which a degraded read
/// compares before and after its reads. Version 7: a [`crate::StorageCall`] carries its
/// [`crate::Service`] (a reserved stream's deadline, best effort, or rebuild). Version 8:
/// snapshots are fenced against writes in flight (`SnapshotFence`, `SnapshotRelease`).
/// Version 9: directories have modification times (`NamespaceRequest::TouchDir`, `modified`
/// in `NamespaceEntry::Dir`). Version 10: access and change times (`NamespaceRequest::SetTimes`,
/// `times` in `NamespaceEntry`). Version 11: a client's sync restates the size its writes
/// gave a file (`ManagerRequest::SyncFile`). Version 12: a file's stored bytes past a point
/// are discarded in one request per column and region (`StorageRequest::Discard`), so that
/// truncating a file costs no write of zeros. Version 13: a debt has a tag that every reported
/// miss changes, and `Resynced` names it (`FileDebt::tag`, `ManagerError::DebtChanged`).
/// Version 14: frames are unchanged, but the datagram transport that carries them speaks
/// datagram format 4 (`tessera_datagram::packet::VERSION`: an AES-128-GCM-SIV MAC, no CRC32C),
/// which a version-13 peer cannot read; the bump makes the TCP handshake, which every datagram
/// session starts with, refuse the mix by name instead of leaving datagrams dropped unread.
/// Version 15: a client's sync describes and syncs a file in one request
/// (`StorageRequest::DescribeAndSync`). Version 16: a mirrored write (RAID-1 copies, Hybrid
/// overflow entries) reaches its mirror only once its primary copy is answered, and a scrub
/// repairs a mirror under a fence (`StorageRequest::MirrorFence`, `MirrorRelease`,
/// `UnderMirrorFence`); a mix with version 15 peers would let a scrub undo a write.
pub const PROTOCOL_VERSION: u8 = 16;
/// First two bytes of every frame.
pub const FRAME_MAGIC: [u8; 2] = *b"TS";
/// Size of the fixed frame header.
pub const FRAME_HEADER_BYTES: usize = 20;
/// Largest serialized message (metadata listings are the big ones).
pub const MESSAGE_BYTES_MAX: u32 = 8 << 20;
/// Largest bulk payload in one frame.
pub const PAYLOAD_BYTES_MAX: u32 = 16 << 20;

/// Errors in decoding bytes from the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame does not start with the magic bytes.
    #[error("not a Tessera frame (bad magic)")]
    BadMagic,
    /// The frame's protocol version is not ours.
    #[error("protocol version {0} is not supported (this build speaks {PROTOCOL_VERSION})")]
    Version(u8),
    /// The frame kind byte is unknown.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// A length field exceeds its bound.
    #[error("frame too large: {field} is {len} bytes, at most {max}")]
    TooLarge {
        /// Which field.
        field: &'static str,
        /// Its value.
        len: u32,
        /// Its bound.
        max: u32,
    },
    /// Fewer bytes than the header announces.
    #[error("truncated frame")]
    Truncated,
    /// The message bytes do not decode as the expected message type.
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// Whether a frame asks or answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A request; the peer answers with a response of the same request id.
    Request,
    /// A response to the request with the same id.
    Response,
}

/// The fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Request or response.
    pub kind: FrameKind,
    /// Length of the serialized message that follows.
    pub message_len: u32,
    /// Length of the raw payload after the message.
    pub payload_len: u32,
    /// Matches a response to its request.
    pub request_id: u64,
}

impl FrameHeader {
    /// Encode the header.
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        assert!(self.message_len <= MESSAGE_BYTES_MAX);
        assert!(self.payload_len <= PAYLOAD_BYTES_MAX);
        let mut out = [0u8; FRAME_HEADER_BYTES];
        out[0..2].copy_from_slice(&FRAME_MAGIC);
        out[2] = PROTOCOL_VERSION;
        out[3] = match self.kind {
            FrameKind::Request => 1,
            FrameKind::Response => 2,
        };
        out[4..8].copy_from_slice(&self.message_len.to_le_bytes());
        out[8..12].copy_from_slice(&self.payload_len.to_le_bytes());
        out[12..20].copy_from_slice(&self.request_id.to_le_bytes());
        out
    }

    /// Decode and bound-check a header.
    pub fn decode(bytes: &[u8; FRAME_HEADER_BYTES]) -> Result<FrameHeader, WireError> {
        if bytes[0..2] != FRAME_MAGIC {
            return Err(WireError::BadMagic);
        }
        if bytes[2] != PROTOCOL_VERSION {
            return Err(WireError::Version(bytes[2]));
        }
        let kind = match bytes[3] {
            1 => FrameKind::Request,
            2 => FrameKind::Response,
            other => return Err(WireError::Kind(other)),
        };
        let word = |range: std::ops::Range<usize>| {
            u32::from_le_bytes(bytes[range].try_into().expect("4 bytes"))
        };
        let message_len = word(4..8);
        let payload_len = word(8..12);
        if message_len > MESSAGE_BYTES_MAX {
            return Err(WireError::TooLarge {
                field: "message",
                len: message_len,
                max: MESSAGE_BYTES_MAX,
            });
        }
        if payload_len > PAYLOAD_BYTES_MAX {
            return Err(WireError::TooLarge {
                field: "payload",
                len: payload_len,
                max: PAYLOAD_BYTES_MAX,
            });
        }
        Ok(FrameHeader {
            kind,
            message_len,
            payload_len,
            request_id: u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes")),
        })
    }

    /// Total bytes of the frame this header starts.
    pub fn frame_len(&self) -> usize {
        FRAME_HEADER_BYTES + self.message_len as usize + self.payload_len as usize
    }
}

/// A whole frame in memory: what a transport moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Request or response.
    pub kind: FrameKind,
    /// Matches a response to its request.
    pub request_id: u64,
    /// The serialized message.
    pub message: Bytes,
    /// Raw bulk data (stripe units), possibly empty.
    pub payload: Bytes,
}

impl Frame {
    /// A frame carrying `message` and `payload`.
    pub fn new<T: Serialize>(
        kind: FrameKind,
        request_id: u64,
        message: &T,
        payload: Bytes,
    ) -> Frame {
        Frame {
            kind,
            request_id,
            message: Bytes::from(encode_message(message)),
            payload,
        }
    }

    /// The header describing this frame.
    pub fn header(&self) -> FrameHeader {
        FrameHeader {
            kind: self.kind,
            message_len: u32::try_from(self.message.len()).expect("message bounded"),
            payload_len: u32::try_from(self.payload.len()).expect("payload bounded"),
            request_id: self.request_id,
        }
    }

    /// Decode the message as `T`.
    pub fn decode_message<T: DeserializeOwned>(&self) -> Result<T, WireError> {
        decode_message(&self.message)
    }

    /// The frame as one contiguous buffer (header, message, payload).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.header().frame_len());
        out.extend_from_slice(&self.header().encode());
        out.extend_from_slice(&self.message);
        out.extend_from_slice(&self.payload);
        out
    }

    /// Decode one frame from the front of `buf`: `Ok(None)` if more bytes are needed, else the
    /// frame and how many bytes it used.
    pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
        Self::decode_with(buf, |range| Bytes::copy_from_slice(&buf[range]))
    }

    /// [`decode`](Self::decode) of a frame held as [`Bytes`]: its message and payload are
    /// slices of `buf`, not copies (the same checks, so both accept the same frames).
    pub fn decode_bytes(buf: &Bytes) -> Result<Option<(Frame, usize)>, WireError> {
        Self::decode_with(buf, |range| buf.slice(range))
    }

    /// The one decoder behind both; `part` makes the message or payload of a byte range.
    fn decode_with(
        buf: &[u8],
        part: impl Fn(std::ops::Range<usize>) -> Bytes,
    ) -> Result<Option<(Frame, usize)>, WireError> {
        let Some(head) = buf.first_chunk::<FRAME_HEADER_BYTES>() else {
            // Reject garbage as early as the bytes allow.
            if !buf.is_empty() && buf[0] != FRAME_MAGIC[0] {
                return Err(WireError::BadMagic);
            }
            return Ok(None);
        };
        let header = FrameHeader::decode(head)?;
        let total = header.frame_len();
        if buf.len() < total {
            return Ok(None);
        }
        let message_end = FRAME_HEADER_BYTES + header.message_len as usize;
        Ok(Some((
            Frame {
                kind: header.kind,
                request_id: header.request_id,
                message: part(FRAME_HEADER_BYTES..message_end),
                payload: part(message_end..total),
            },
            total,
        )))
    }
}

/// Serialize a message.
pub fn encode_message<T: Serialize>(message: &T) -> Vec<u8> {
    let bytes = postcard::to_stdvec(message).expect("messages always serialize");
    assert!(
        bytes.len() <= MESSAGE_BYTES_MAX as usize,
        "message over bound"
    );
    bytes
}

/// Deserialize a message; garbage gives an error, never a panic.
pub fn decode_message<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    if bytes.len() > MESSAGE_BYTES_MAX as usize {
        return Err(WireError::TooLarge {
            field: "message",
            len: u32::try_from(bytes.len()).unwrap_or(u32::MAX),
            max: MESSAGE_BYTES_MAX,
        });
    }
    let (value, rest) =
        postcard::take_from_bytes(bytes).map_err(|e| WireError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(format!(
            "{} trailing bytes after message",
            rest.len()
        )));
    }
    Ok(value)
}
