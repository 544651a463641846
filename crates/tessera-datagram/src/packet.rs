//! The packet: one datagram, its fixed header and its codec.
//!
//! [`Packet::encode`] and [`decode`] enforce the same rules ([`Packet::check`]), so anything
//! encoded decodes to the same packet and anything decoded re-encodes to the same bytes.
//!
//! **One integrity check per datagram (format 4).** A datagram is checked by its MAC alone
//! ([`verify`], `tessera_auth::PacketMac`: AES-128-GCM-SIV over header and payload). Format 3
//! also carried a CRC32C of the same bytes, and both ends computed both: every payload byte
//! was read twice per datagram on each side for one purpose, since the MAC already refuses
//! any change a checksum would (a garbled datagram does not verify, under a session's key or
//! the public one). [`decode`] checks lengths and fields only; the endpoint verifies the MAC
//! of every packet before it touches any state, under the session's key or, for sessions set
//! up without a handshake and for RESETs, under the public key (a checksum then, as the CRC
//! was). The one packet left unverified is one for a session this endpoint has no key for
//! and would not open (`Config::require_session_keys`), which at most earns its sender a
//! rate-limited RESET, as a forged one would.

use bytes::Bytes;
use std::sync::LazyLock;
use tessera_auth::PacketMac;

/// First two bytes of every packet, "TS".
pub const MAGIC: u16 = 0x5453;
/// The protocol version this crate speaks. Checked before anything else, so that a later
/// version may change the rest of the layout.
/// Version 3 added the [`TAG_LEN`]-byte MAC after the payload; version 4 made it AES-128-GCM-SIV
/// (it was keyed BLAKE3) and dropped the header's CRC32C, which the MAC made redundant.
pub const VERSION: u8 = 4;
/// Size of the fixed header that precedes the payload.
pub const HEADER_LEN: usize = 40;
/// Size of the MAC that follows the payload: AES-128-GCM-SIV of header and payload
/// (`tessera_auth::PacketMac`), under the session's key.
pub const TAG_LEN: usize = tessera_auth::PACKET_TAG_BYTES;
/// Bytes of every datagram besides its payload.
pub const OVERHEAD_LEN: usize = HEADER_LEN + TAG_LEN;
/// Largest payload one packet can describe (`payload_len` is a `u16`).
pub const PAYLOAD_LEN_MAX: usize = u16::MAX as usize;
/// Largest datagram one packet can be.
pub const DATAGRAM_LEN_MAX: usize = OVERHEAD_LEN + PAYLOAD_LEN_MAX;
/// The key of sessions set up without a handshake (tests, simulations, unauthenticated
/// deployments) and of RESETs, which a peer sends for sessions it does not know: public, so
/// their tag protects against corruption only, as a checksum would.
pub const PUBLIC_KEY: tessera_auth::Key = tessera_auth::Key([0; tessera_auth::KEY_BYTES]);

static PUBLIC_MAC: LazyLock<PacketMac> = LazyLock::new(|| PacketMac::new(&PUBLIC_KEY));

/// The MAC of [`PUBLIC_KEY`], keyed once per process.
pub fn public_mac() -> &'static PacketMac {
    &PUBLIC_MAC
}

/// Flag: the DATA packet carries the first fragment of a message (and `message_len`).
pub const FLAG_FIRST: u8 = 0x01;
/// Flag: the DATA packet carries the last fragment of a message.
pub const FLAG_LAST: u8 = 0x02;
/// Flag: the ACK packet is a window probe and asks for an ACK at once.
pub const FLAG_PROBE: u8 = 0x04;

const OFFSET_MAGIC: usize = 0;
const OFFSET_VERSION: usize = 2;
const OFFSET_KIND: usize = 3;
const OFFSET_SESSION: usize = 4;
const OFFSET_SEQ: usize = 12;
const OFFSET_ACK: usize = 16;
const OFFSET_WINDOW: usize = 20;
const OFFSET_TIMESTAMP: usize = 24;
const OFFSET_ECHO: usize = 28;
/// `message_len` on a first fragment, `ack_delay` on every other packet: one field, so that
/// the header stays small (40 bytes since version 4, which dropped the 4-byte checksum).
const OFFSET_MESSAGE_LEN_OR_ACK_DELAY: usize = 32;
const OFFSET_FLAGS: usize = 36;
const OFFSET_QUEUE: usize = 37;
const OFFSET_PAYLOAD_LEN: usize = 38;

/// What a packet is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PacketKind {
    /// One fragment of a message.
    Data,
    /// Acknowledgement (and receive window) only; a window probe when it carries
    /// [`FLAG_PROBE`].
    Ack,
    /// The receiver saw a gap: resend from `seq`, the sequence number it expects.
    Restart,
    /// The sender knows no such session: forget it.
    Reset,
}

impl PacketKind {
    /// The kind's byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            PacketKind::Data => 1,
            PacketKind::Ack => 2,
            PacketKind::Restart => 3,
            PacketKind::Reset => 4,
        }
    }

    /// The kind a byte on the wire names, if any.
    pub fn from_code(code: u8) -> Option<PacketKind> {
        match code {
            1 => Some(PacketKind::Data),
            2 => Some(PacketKind::Ack),
            3 => Some(PacketKind::Restart),
            4 => Some(PacketKind::Reset),
            _ => None,
        }
    }
}

/// One decoded packet. Sequence numbers, acknowledgements and timestamps are the low 32 bits
/// of the endpoint's 64-bit values; the receiving side widens them again around what it
/// expects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// What the packet is for.
    pub kind: PacketKind,
    /// DATA only: first fragment of a message.
    pub first: bool,
    /// DATA only: last fragment of a message.
    pub last: bool,
    /// ACK only: a window probe, asking for an ACK at once.
    pub probe: bool,
    /// The session, as chosen by the connecting side.
    pub session: u64,
    /// DATA: this packet's sequence number. RESTART: the sequence number the receiver
    /// expects. ACK: the sender's next sequence number (informative).
    pub seq: u32,
    /// Cumulative acknowledgement: the next sequence number expected from the peer.
    pub ack: u32,
    /// How many packets past `ack` the sender of this packet can still accept.
    pub window: u32,
    /// The sender's clock when it sent this packet, microseconds, low 32 bits.
    pub timestamp: u32,
    /// The timestamp of the packet that last advanced `ack`, echoed for RTT measurement.
    pub echo: u32,
    /// DATA with `first`: the length of the whole message. Zero otherwise.
    pub message_len: u32,
    /// Microseconds between the arrival of the packet whose timestamp is echoed and the
    /// sending of this one: the time the peer held it, which the RTT sample leaves out
    /// (QUIC's ack delay, RFC 9000 section 19.3). Zero on a first fragment, which carries
    /// `message_len` in its place.
    pub ack_delay: u32,
    /// The queueing delay the sender of this packet measured on the path from the peer
    /// ([`crate::radon::queue_code`]; 0: none seen, or a peer from before Radon, whose byte
    /// here was reserved and zero).
    pub queue: u8,
    /// DATA only: the fragment's bytes.
    pub payload: Bytes,
}

/// Why a datagram is not a packet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Shorter than its header, or than the header plus the payload it announces.
    #[error("datagram of {len} bytes is truncated ({needed} bytes needed)")]
    Truncated {
        /// The datagram's length.
        len: usize,
        /// The length its header requires.
        needed: usize,
    },
    /// Longer than the header plus the payload it announces.
    #[error("datagram of {len} bytes has bytes after its {expected}-byte packet")]
    TrailingBytes {
        /// The datagram's length.
        len: usize,
        /// The length its header announces.
        expected: usize,
    },
    /// Not one of ours.
    #[error("bad magic {0:#06x}")]
    Magic(u16),
    /// A protocol version this endpoint does not speak.
    #[error("unsupported protocol version {0}")]
    Version(u8),
    /// An unknown packet kind.
    #[error("unknown packet kind {0}")]
    Kind(u8),
    /// Unknown flag bits, or flags that the packet's kind does not allow.
    #[error("flags {flags:#04x} not allowed on a {kind:?} packet")]
    Flags {
        /// The packet's kind.
        kind: PacketKind,
        /// The flags byte.
        flags: u8,
    },
    /// A payload on a packet kind that carries none, or an empty middle fragment.
    #[error("{kind:?} packet with a {payload_len}-byte payload")]
    Payload {
        /// The packet's kind.
        kind: PacketKind,
        /// The payload's length.
        payload_len: usize,
    },
    /// `message_len` on a packet that is no first fragment, or smaller than the first
    /// fragment, or different from the payload of a one-fragment message; or an
    /// `ack_delay` on a first fragment, whose field holds the message length instead.
    #[error("message length {message_len} inconsistent with a {payload_len}-byte fragment")]
    MessageLength {
        /// The `message_len` field.
        message_len: u32,
        /// The payload's length.
        payload_len: usize,
    },
}

impl Packet {
    /// The flags byte of this packet.
    pub fn flags(&self) -> u8 {
        let mut flags = 0;
        if self.first {
            flags |= FLAG_FIRST;
        }
        if self.last {
            flags |= FLAG_LAST;
        }
        if self.probe {
            flags |= FLAG_PROBE;
        }
        flags
    }

    /// Length of the encoded packet.
    pub fn encoded_len(&self) -> usize {
        OVERHEAD_LEN + self.payload.len()
    }

    /// Whether the fields are consistent: the rules `decode` enforces.
    pub fn check(&self) -> Result<(), PacketError> {
        let flags = self.flags();
        let allowed = match self.kind {
            PacketKind::Data => FLAG_FIRST | FLAG_LAST,
            PacketKind::Ack => FLAG_PROBE,
            PacketKind::Restart | PacketKind::Reset => 0,
        };
        if flags & !allowed != 0 {
            return Err(PacketError::Flags {
                kind: self.kind,
                flags,
            });
        }
        let payload_len = self.payload.len();
        if payload_len > PAYLOAD_LEN_MAX {
            return Err(PacketError::Payload {
                kind: self.kind,
                payload_len,
            });
        }
        match self.kind {
            PacketKind::Data => {
                // Only a one-fragment empty message may have an empty payload: every other
                // fragment moves at least one byte, so a message has at most as many
                // fragments as bytes.
                if payload_len == 0 && !(self.first && self.last) {
                    return Err(PacketError::Payload {
                        kind: self.kind,
                        payload_len,
                    });
                }
            }
            PacketKind::Ack | PacketKind::Restart | PacketKind::Reset => {
                if payload_len != 0 {
                    return Err(PacketError::Payload {
                        kind: self.kind,
                        payload_len,
                    });
                }
            }
        }
        let message_len_ok = if self.first {
            let message_len = self.message_len as usize;
            if self.last {
                message_len == payload_len
            } else {
                message_len > payload_len
            }
        } else {
            self.message_len == 0
        };
        if !message_len_ok || (self.first && self.ack_delay != 0) {
            return Err(PacketError::MessageLength {
                message_len: self.message_len,
                payload_len,
            });
        }
        Ok(())
    }

    /// Appends the encoded packet to `buffer`, tagged with [`PUBLIC_KEY`]. Panics if the
    /// packet breaks a rule of [`Packet::check`]: the endpoint only builds valid packets.
    pub fn encode_into(&self, buffer: &mut Vec<u8>) {
        self.encode_into_with(buffer, public_mac());
    }

    /// Appends the encoded packet to `buffer`, tagged with `mac`.
    pub fn encode_into_with(&self, buffer: &mut Vec<u8>, mac: &PacketMac) {
        let (header, tag) = self.encode_parts(mac);
        buffer.reserve(self.encoded_len());
        buffer.extend_from_slice(&header);
        buffer.extend_from_slice(&self.payload);
        buffer.extend_from_slice(&tag);
    }

    /// The encoded packet's header and tag, under `mac`: the datagram is the header, the
    /// payload and the tag, one after the other. The payload is read (once, for the tag) but
    /// not copied, so a driver can send the three as they are (see [`crate::Transmit`]).
    /// Panics as [`encode_into`](Self::encode_into) does.
    pub fn encode_parts(&self, mac: &PacketMac) -> ([u8; HEADER_LEN], [u8; TAG_LEN]) {
        self.encode_parts_hashed(mac, None)
    }

    /// [`encode_parts`](Self::encode_parts), with the payload's part of the tag from `hash`
    /// where it was made under `mac` for a payload of this length
    /// ([`PacketMac::tag_hashed`]; the caller's promise: of this payload).
    pub fn encode_parts_hashed(
        &self,
        mac: &PacketMac,
        hash: Option<&tessera_auth::PayloadHash>,
    ) -> ([u8; HEADER_LEN], [u8; TAG_LEN]) {
        if let Err(error) = self.check() {
            panic!("encoding an invalid packet: {error}");
        }
        let mut header = [0u8; HEADER_LEN];
        header[OFFSET_MAGIC..OFFSET_MAGIC + 2].copy_from_slice(&MAGIC.to_be_bytes());
        header[OFFSET_VERSION] = VERSION;
        header[OFFSET_KIND] = self.kind.code();
        header[OFFSET_SESSION..OFFSET_SESSION + 8].copy_from_slice(&self.session.to_be_bytes());
        let words = [
            (OFFSET_SEQ, self.seq),
            (OFFSET_ACK, self.ack),
            (OFFSET_WINDOW, self.window),
            (OFFSET_TIMESTAMP, self.timestamp),
            (OFFSET_ECHO, self.echo),
            (
                OFFSET_MESSAGE_LEN_OR_ACK_DELAY,
                if self.first {
                    self.message_len
                } else {
                    self.ack_delay
                },
            ),
        ];
        for (offset, word) in words {
            header[offset..offset + 4].copy_from_slice(&word.to_be_bytes());
        }
        header[OFFSET_FLAGS] = self.flags();
        header[OFFSET_QUEUE] = self.queue;
        header[OFFSET_PAYLOAD_LEN..HEADER_LEN]
            .copy_from_slice(&(self.payload.len() as u16).to_be_bytes());
        let tag = mac.tag_hashed(&header, &self.payload, hash);
        (header, tag)
    }

    /// The encoded packet, tagged with [`PUBLIC_KEY`].
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(public_mac())
    }

    /// The encoded packet, tagged with `mac`.
    pub fn encode_with(&self, mac: &PacketMac) -> Vec<u8> {
        let mut buffer = Vec::with_capacity(self.encoded_len());
        self.encode_into_with(&mut buffer, mac);
        buffer
    }
}

/// The session a datagram names, if it is long enough to be a packet of this version (read
/// before anything is verified, to pick the key to verify it with).
pub fn session_of(datagram: &[u8]) -> Option<u64> {
    if datagram.len() < OVERHEAD_LEN
        || read_u16(datagram, OFFSET_MAGIC) != MAGIC
        || datagram[OFFSET_VERSION] != VERSION
    {
        return None;
    }
    Some(read_u64(datagram, OFFSET_SESSION))
}

/// Whether the datagram's MAC is the one `mac` gives its header and payload (all its bytes
/// between the header and the last [`TAG_LEN`]). Compared in constant time. A datagram
/// shorter than a header and a tag is not authentic.
pub fn verify(datagram: &[u8], mac: &PacketMac) -> bool {
    let Some(body_len) = datagram.len().checked_sub(TAG_LEN) else {
        return false;
    };
    let Some((header, payload)) = datagram[..body_len].split_first_chunk::<HEADER_LEN>() else {
        return false;
    };
    mac.verify(header, payload, &datagram[body_len..])
}

/// Writes the tag of `datagram` (under [`PUBLIC_KEY`]) into its last [`TAG_LEN`] bytes,
/// after other bytes of it were changed: for tests and fuzzing, which alter packets and
/// still want them to reach the checks behind the MAC. A datagram shorter than a header and
/// a tag is left as it is.
pub fn seal(datagram: &mut [u8]) {
    seal_with(datagram, public_mac());
}

/// [`seal`] with the tag of `mac`.
pub fn seal_with(datagram: &mut [u8], mac: &PacketMac) {
    if datagram.len() < OVERHEAD_LEN {
        return;
    }
    let body_len = datagram.len() - TAG_LEN;
    let (body, tag) = datagram.split_at_mut(body_len);
    let (header, payload) = body
        .split_first_chunk::<HEADER_LEN>()
        .expect("checked: at least a header before the tag");
    tag.copy_from_slice(&mac.tag(header, payload));
}

fn read_u16(datagram: &[u8], offset: usize) -> u16 {
    u16::from_be_bytes([datagram[offset], datagram[offset + 1]])
}

fn read_u32(datagram: &[u8], offset: usize) -> u32 {
    let mut bytes = [0; 4];
    bytes.copy_from_slice(&datagram[offset..offset + 4]);
    u32::from_be_bytes(bytes)
}

fn read_u64(datagram: &[u8], offset: usize) -> u64 {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&datagram[offset..offset + 8]);
    u64::from_be_bytes(bytes)
}

/// Decodes one datagram. Never panics: every length is checked before it is used.
///
/// The checks run in this order, so that each error names the first thing wrong: length of
/// the header, magic, version, length of the payload, then the fields. The MAC is not
/// checked here ([`verify`]: the endpoint picks the key by the session). The payload is
/// copied out of `datagram`; [`decode_bytes`] slices it instead.
pub fn decode(datagram: &[u8]) -> Result<Packet, PacketError> {
    decode_with(datagram, |range| Bytes::copy_from_slice(&datagram[range]))
}

/// [`decode`] of a datagram held as [`Bytes`]: the payload is a slice of `datagram`, not a
/// copy (the same checks, so both accept exactly the same datagrams).
pub fn decode_bytes(datagram: &Bytes) -> Result<Packet, PacketError> {
    decode_with(datagram, |range| datagram.slice(range))
}

/// The one decoder behind [`decode`] and [`decode_bytes`]; `payload` makes the payload of
/// the byte range it is given.
fn decode_with(
    datagram: &[u8],
    payload: impl FnOnce(std::ops::Range<usize>) -> Bytes,
) -> Result<Packet, PacketError> {
    let len = datagram.len();
    if len < OVERHEAD_LEN {
        return Err(PacketError::Truncated {
            len,
            needed: OVERHEAD_LEN,
        });
    }
    let magic = read_u16(datagram, OFFSET_MAGIC);
    if magic != MAGIC {
        return Err(PacketError::Magic(magic));
    }
    let version = datagram[OFFSET_VERSION];
    if version != VERSION {
        return Err(PacketError::Version(version));
    }
    let payload_len = read_u16(datagram, OFFSET_PAYLOAD_LEN) as usize;
    let expected = OVERHEAD_LEN + payload_len;
    if len < expected {
        return Err(PacketError::Truncated {
            len,
            needed: expected,
        });
    }
    if len > expected {
        return Err(PacketError::TrailingBytes { len, expected });
    }
    let body_len = len - TAG_LEN;
    let kind_code = datagram[OFFSET_KIND];
    let kind = PacketKind::from_code(kind_code).ok_or(PacketError::Kind(kind_code))?;
    let flags = datagram[OFFSET_FLAGS];
    if flags & !(FLAG_FIRST | FLAG_LAST | FLAG_PROBE) != 0 {
        return Err(PacketError::Flags { kind, flags });
    }
    let first = flags & FLAG_FIRST != 0;
    let shared_field = read_u32(datagram, OFFSET_MESSAGE_LEN_OR_ACK_DELAY);
    let (message_len, ack_delay) = if first {
        (shared_field, 0)
    } else {
        (0, shared_field)
    };
    let packet = Packet {
        kind,
        first,
        last: flags & FLAG_LAST != 0,
        probe: flags & FLAG_PROBE != 0,
        session: read_u64(datagram, OFFSET_SESSION),
        seq: read_u32(datagram, OFFSET_SEQ),
        ack: read_u32(datagram, OFFSET_ACK),
        window: read_u32(datagram, OFFSET_WINDOW),
        timestamp: read_u32(datagram, OFFSET_TIMESTAMP),
        echo: read_u32(datagram, OFFSET_ECHO),
        message_len,
        ack_delay,
        queue: datagram[OFFSET_QUEUE],
        payload: payload(HEADER_LEN..body_len),
    };
    packet.check()?;
    Ok(packet)
}

/// Widens a 32-bit sequence number from the wire to the 64-bit value nearest `expected`
/// (the technique of QUIC's packet numbers): correct while the two are less than 2^31 apart,
/// which the windows (at most a few thousand packets) guarantee for honest traffic.
pub fn widen(wire: u32, expected: u64) -> u64 {
    const SPAN: u64 = 1 << 32;
    const HALF: u64 = 1 << 31;
    let candidate = (expected & !(SPAN - 1)) | wire as u64;
    if candidate.saturating_add(HALF) <= expected && candidate <= u64::MAX - SPAN {
        candidate + SPAN
    } else if candidate > expected.saturating_add(HALF) && candidate >= SPAN {
        candidate - SPAN
    } else {
        candidate
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packet_strategy() -> impl Strategy<Value = Packet> {
        let kind = prop_oneof![
            Just(PacketKind::Data),
            Just(PacketKind::Ack),
            Just(PacketKind::Restart),
            Just(PacketKind::Reset),
        ];
        (
            kind,
            any::<(bool, bool, bool)>(),
            any::<(u64, u32, u32, u32, u32, u32)>(),
            prop::collection::vec(any::<u8>(), 0..3000),
            0u32..1_000_000,
            any::<u32>(),
            any::<u8>(),
        )
            .prop_map(
                |(kind, (first, last, probe), fields, payload, extra, ack_delay, queue)| {
                    let (session, seq, ack, window, timestamp, echo) = fields;
                    let mut packet = Packet {
                        kind,
                        first: false,
                        last: false,
                        probe: false,
                        session,
                        seq,
                        ack,
                        window,
                        timestamp,
                        echo,
                        message_len: 0,
                        ack_delay,
                        queue,
                        payload: Bytes::new(),
                    };
                    match kind {
                        PacketKind::Data => {
                            packet.first = first;
                            packet.last = last;
                            let mut payload = payload;
                            if payload.is_empty() && !(first && last) {
                                payload.push(7);
                            }
                            if first {
                                packet.ack_delay = 0;
                                packet.message_len =
                                    payload.len() as u32 + if last { 0 } else { 1 + extra };
                            }
                            packet.payload = Bytes::from(payload);
                        }
                        PacketKind::Ack => packet.probe = probe,
                        PacketKind::Restart | PacketKind::Reset => {}
                    }
                    packet
                },
            )
    }

    proptest! {
        #[test]
        fn decode_of_encode_is_identity(packet in packet_strategy()) {
            let bytes = packet.encode();
            prop_assert_eq!(bytes.len(), packet.encoded_len());
            let decoded = decode(&bytes).unwrap();
            prop_assert_eq!(&decode_bytes(&Bytes::from(bytes.clone())).unwrap(), &packet);
            prop_assert_eq!(&decoded, &packet);
            prop_assert_eq!(decoded.encode(), bytes);
        }

        #[test]
        fn decode_of_random_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            prop_assert_eq!(decode_bytes(&Bytes::from(bytes.clone())), decode(&bytes));
        }

        #[test]
        fn decode_of_random_bytes_behind_a_valid_prefix_never_panics(
            tail in prop::collection::vec(any::<u8>(), 0..200),
            cut in 0usize..HEADER_LEN,
        ) {
            // Random bytes rarely get past the magic; start from a real header so that the
            // later checks are exercised too.
            let packet = Packet {
                kind: PacketKind::Ack, first: false, last: false, probe: false, session: 1,
                seq: 2, ack: 3, window: 4, timestamp: 5, echo: 6, message_len: 0, ack_delay: 7, queue: 8,
                payload: Bytes::new(),
            };
            let mut bytes = packet.encode();
            bytes.truncate(cut.max(4));
            bytes.extend_from_slice(&tail);
            let _ = decode(&bytes);
        }

        #[test]
        fn any_single_bit_flip_is_refused(packet in packet_strategy(), bit in any::<prop::sample::Index>()) {
            let mut bytes = packet.encode();
            let bit = bit.index(bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            // The MAC catches it anywhere: in the header, the payload and the tag itself.
            prop_assert!(!verify(&bytes, public_mac()));
            // And a flip of header or payload the decoder lets through decodes to another
            // packet, never to this one.
            if bit / 8 < bytes.len() - TAG_LEN {
                prop_assert_ne!(decode(&bytes).ok(), Some(packet));
            }
        }

        #[test]
        fn a_packet_verifies_only_under_its_own_key(packet in packet_strategy(), key in any::<[u8; 32]>()) {
            let key = tessera_auth::Key(key);
            let mac = PacketMac::new(&key);
            let bytes = packet.encode_with(&mac);
            prop_assert!(verify(&bytes, &mac));
            prop_assert_eq!(decode(&bytes), Ok(packet));
            prop_assert_eq!(verify(&bytes, public_mac()), key == PUBLIC_KEY);
        }

        #[test]
        fn a_datagram_forged_without_the_key_is_refused(
            packet in packet_strategy(), key in any::<[u8; 32]>(), forged_tag in any::<[u8; TAG_LEN]>(),
        ) {
            // An attacker who knows everything but the session key: the same bytes tagged
            // with the public key, with another key, or with any tag it makes up.
            let mac = PacketMac::new(&tessera_auth::Key(key));
            prop_assume!(tessera_auth::Key(key) != PUBLIC_KEY);
            prop_assert!(!verify(&packet.encode(), &mac));
            let mut other = key;
            other[0] ^= 1;
            prop_assert!(!verify(&packet.encode_with(&PacketMac::new(&tessera_auth::Key(other))), &mac));
            let mut made_up = packet.encode_with(&mac);
            let body_len = made_up.len() - TAG_LEN;
            prop_assume!(made_up[body_len..] != forged_tag);
            made_up[body_len..].copy_from_slice(&forged_tag);
            prop_assert!(!verify(&made_up, &mac));
        }

        #[test]
        fn widen_inverts_truncation_near_the_expected_value(
            value in 0u64..(1 << 40), distance in -(1i64 << 30)..(1i64 << 30),
        ) {
            let expected = value.saturating_add_signed(distance);
            prop_assert_eq!(widen(value as u32, expected), value);
        }
    }

    #[test]
    fn errors_name_the_first_thing_wrong() {
        let packet = Packet {
            kind: PacketKind::Data,
            first: true,
            last: true,
            probe: false,
            session: 9,
            seq: 0,
            ack: 0,
            window: 4,
            timestamp: 1,
            echo: 0,
            message_len: 3,
            ack_delay: 0,
            queue: 0,
            payload: Bytes::from_static(b"abc"),
        };
        let bytes = packet.encode();
        assert_eq!(
            decode(&bytes[..10]),
            Err(PacketError::Truncated {
                len: 10,
                needed: OVERHEAD_LEN
            })
        );
        assert_eq!(
            decode(&bytes[..OVERHEAD_LEN + 1]),
            Err(PacketError::Truncated {
                len: OVERHEAD_LEN + 1,
                needed: OVERHEAD_LEN + 3
            })
        );
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            decode(&longer),
            Err(PacketError::TrailingBytes { .. })
        ));
        let mut version = bytes.clone();
        version[OFFSET_VERSION] = 1;
        assert_eq!(decode(&version), Err(PacketError::Version(1)));
        let mut magic = bytes.clone();
        magic[0] = 0;
        assert_eq!(decode(&magic), Err(PacketError::Magic(0x0053)));
        let mut flipped = bytes.clone();
        flipped[HEADER_LEN] ^= 1;
        // A flipped payload bit decodes (the decoder checks no bytes of the payload)...
        assert!(decode(&flipped).is_ok());
        // ...and its MAC refuses it.
        assert!(!verify(&flipped, public_mac()));
        let mut kind = bytes.clone();
        kind[OFFSET_KIND] = 9;
        assert_eq!(decode(&kind), Err(PacketError::Kind(9)));
    }

    #[test]
    fn widen_handles_the_wrap() {
        assert_eq!(widen(0, u32::MAX as u64), 1 << 32);
        assert_eq!(widen(u32::MAX, 1 << 32), u32::MAX as u64);
        assert_eq!(widen(5, 0), 5);
        assert_eq!(widen(u32::MAX, 0), u32::MAX as u64);
        assert_eq!(widen(7, u64::MAX - 3), 0xFFFF_FFFF_0000_0007);
    }
}
