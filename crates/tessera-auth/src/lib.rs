//! Tessera's authentication core: the cluster secret, the keys derived from it, client access
//! keys, and the proofs and MACs computed with them. Pure: no sockets, no clock, no randomness
//! inside (callers pass the random bytes in). The keyed hash is BLAKE3 (`blake3` crate) in its
//! keyed and key-derivation modes; nothing here is hand-written cryptography.
//!
//! # Design
//!
//! **Principals.** A peer claims one of three roles ([`Claim`]):
//! - *admin*: the operator, whose key is derived from the cluster secret
//!   ([`Secret::admin_key`]); manages access keys and clears servers' debts (rebuild);
//! - *server*: a storage server, whose key is derived from the cluster secret
//!   ([`Secret::server_key`]); all servers share it;
//! - *client* `k…`: the holder of an access key issued by the manager (`tessera key create`),
//!   a random 256-bit key stored in the manager's store under a random 64-bit [`KeyId`].
//!
//! **The cluster secret** is 32 random bytes, written with mode 0600 by `tessera up` (local
//! cluster) and `tessera manager --init` (real deployments) in a versioned text file
//! ([`Secret::to_file_text`]). The manager and every server read it.
//!
//! **Mutual authentication at connection setup.** The connecting side sends its claim and a
//! fresh 32-byte nonce; the accepting side looks the claim's key up, answers with its own fresh
//! nonce and a proof that it holds the key ([`proof`] over both nonces, the claim and the side);
//! the connecting side checks it and answers with its own proof. Both nonces are fresh, so a
//! recorded handshake cannot be replayed to either side, and the accepting side proves it holds
//! the key before the connecting side sends a request, so a client never hands a file to a
//! stranger that took a server's address. A key that is unknown, revoked or proven wrong gets a
//! typed refusal ([`Refusal`]).
//!
//! **What storage servers verify.** Servers do not hold clients' manager keys. Each principal
//! presents a *storage key* to servers, derived one-way from its key ([`Key::storage_key`]); the
//! manager hands servers the list of (key id, storage key) of the access keys that are live, and
//! servers poll it (every second), so a revoked key is refused by every server within about a
//! second, with no clock shared between machines and no tickets to renew. The alternative,
//! per-key tickets with an expiry signed by the manager, keeps servers stateless but makes
//! revocation wait for the expiry and needs synchronised clocks. A server that is broken into
//! learns storage keys only: it can act as a client toward other servers (it already holds the
//! cluster secret), but cannot use a client's key at the manager.
//!
//! **Datagrams.** A datagram session is keyed by [`session_key`], derived from the storage key
//! and both handshake nonces, and every datagram of it carries a 16-byte MAC ([`PacketMac`])
//! in place of an unkeyed checksum.
//!
//! **Why the datagram MAC is AES-128-GCM-SIV and not keyed BLAKE3** (since datagram format
//! 4). The MAC reads every payload byte on both sides, and on this project's machines it was
//! the largest per-byte cost of the datagram transport beside the kernel's copies (issue 19).
//! BLAKE3 is fast on long inputs because it hashes many 1 KiB chunks at once in SIMD lanes;
//! a datagram is one or two chunks on a 1500-byte LAN (~1.2 GB/s measured here) and at most
//! 64 chunks on loopback (~3.5 GB/s). AES-GCM-SIV (RFC 8452) tags with POLYVAL, a polynomial
//! hash that carry-less multiplication (`pclmulqdq`, `vpclmulqdq`) computes several blocks at
//! a time whatever the length, and one AES block: measured on this machine's CPU, 3x
//! BLAKE3's speed on 1,472-byte datagrams and 2x on 64 KiB ones (`docs/notes/dp10.md`). The
//! tag is RFC 8452's: that of an AES-128-GCM-SIV encryption whose associated data is the
//! datagram's payload and whose plaintext is its header (no ciphertext is made; the tag
//! covers both, and their lengths), under a constant nonce. GCM-SIV resists nonce reuse,
//! and with a repeated nonce its tag is a deterministic PRF of the inputs (POLYVAL,
//! almost-universal, then AES), which is all a MAC needs; replays are the protocol's to
//! refuse (sequence numbers, fresh keys per session), as they were with BLAKE3, whose tag is
//! deterministic too. Forging a tag without the key takes a POLYVAL collision: below 2^-36
//! for 2^40 datagrams of 64 KiB under one session key. The AES key is 128 bits, derived
//! one-way from the 256-bit session key. GMAC and Poly1305 would be as fast but need a
//! nonce never repeated under a key, which retransmissions (the same sequence number with
//! new acknowledgements) and two directions under one session key would make a new header
//! field and a new way to fail badly: one repeat reveals the hash key.
//!
//! RFC 8452 derives a message's POLYVAL and AES keys from the key and the nonce: four AES
//! blocks and a key schedule per message. With one nonce they are the same for every
//! datagram, so [`PacketMac::new`] derives them once per session (RFC 8452 section 4, the
//! steps RustCrypto's `aes-gcm-siv` takes per call), and a tag is POLYVAL over the datagram
//! and one AES block, from RustCrypto's `polyval` and `aes`: about half the `aes-gcm-siv`
//! crate's time on a 1,472-byte datagram. No new primitive and no new construction: the
//! test `packet_mac_is_aes_128_gcm_siv` checks tags against `aes-gcm-siv` itself.
//!
//! Where the CPU has AVX-512 and VPCLMULQDQ, the POLYVAL is this crate's own
//! (`wide_polyval`: sixteen blocks per reduction, four per instruction), checked against the
//! `polyval` crate on random inputs; the ignored test `packet_mac_speed_against_blake3`
//! measured 2.0x, 2.9x and 3.2x the `polyval` crate's speed on 1,416-, 8,916- and 65,451-byte
//! payloads (123 ns, 360 ns and 2.1 us a tag; 31 GB/s on the largest).
//!
//! # Authorization
//!
//! Which role each manager request needs is decided in `tessera-manager` (its `authorize`
//! function, whose doc holds the table); storage servers serve any authenticated principal.

use aes::cipher::{BlockCipherEncrypt, KeyInit};
use aes::Aes128;
use polyval::universal_hash::UniversalHash;
use polyval::Polyval;
use wide_polyval::WidePolyval;

mod wide_polyval;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Bytes of every key, secret and nonce.
pub const KEY_BYTES: usize = 32;
/// Bytes of a datagram's MAC ([`packet_tag`]): 128 bits, as QUIC's and TLS's AEAD tags.
pub const PACKET_TAG_BYTES: usize = 16;
/// First line of a cluster secret file; the number is the file format's version.
pub const SECRET_FILE_HEADER: &str = "tessera-cluster-secret v1";
/// Version of the handshake's proofs; a peer speaking another is refused.
pub const HANDSHAKE_VERSION: u8 = 1;

const CONTEXT_ADMIN: &str = "tessera 2026-11-23 admin key v1";
const CONTEXT_SERVER: &str = "tessera 2026-11-23 server key v1";
const CONTEXT_STORAGE: &str = "tessera 2026-11-23 storage key v1";
const CONTEXT_PROOF: &str = "tessera 2026-11-23 handshake proof v1";
const CONTEXT_SESSION: &str = "tessera 2026-11-23 datagram session key v1";
const CONTEXT_REPLICA: &str = "tessera 2026-11-25 manager replica key v1";
const CONTEXT_ACCESS: &str = "tessera 2026-11-25 replicated access key v1";
const CONTEXT_PACKET_MAC: &str = "tessera 2026-11-28 datagram mac key v1";
const CONTEXT_PACKET_MAC_ID: &str = "tessera 2026-11-28 datagram mac id v1";
/// The GCM-SIV nonce of every datagram MAC: constant (see the crate's doc), and naming its use.
pub const PACKET_MAC_NONCE: [u8; 12] = *b"tessera dgm4";

/// Why authentication material could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// A secret file without the expected header line.
    #[error("not a Tessera cluster secret (expected a first line '{SECRET_FILE_HEADER}')")]
    SecretHeader,
    /// Hex text of the wrong length or with a character that is not a hex digit.
    #[error("bad {what}: expected {expected} hex digits")]
    Hex {
        /// What was being read.
        what: &'static str,
        /// How many hex digits it needs.
        expected: usize,
    },
    /// An access key that is not `KEYID:SECRET`.
    #[error("bad access key: expected KEYID:SECRET (k followed by 16 hex digits, a colon, 64 hex digits)")]
    AccessKey,
}

/// A 256-bit key. Its `Debug` never prints the bytes.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key(pub [u8; KEY_BYTES]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// The key that stands for this one at storage servers: one-way, so that servers, which
    /// are handed storage keys, cannot act with the key itself at the manager.
    pub fn storage_key(&self) -> Key {
        Key(blake3::derive_key(CONTEXT_STORAGE, &self.0))
    }

    /// The key as 64 hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// A key from 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Key, AuthError> {
        unhex::<KEY_BYTES>(text, "key").map(Key)
    }
}

/// The cluster secret, from which the admin and server keys are derived.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; KEY_BYTES]);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret from random bytes (drawn by the caller from the OS's generator).
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Secret {
        Secret(bytes)
    }

    /// The admin's key.
    pub fn admin_key(&self) -> Key {
        Key(blake3::derive_key(CONTEXT_ADMIN, &self.0))
    }

    /// The key every storage server authenticates with.
    pub fn server_key(&self) -> Key {
        Key(blake3::derive_key(CONTEXT_SERVER, &self.0))
    }

    /// The key the replicas of a replicated manager MAC their total-order packets with, and
    /// derive access keys from: only holders of the secret can order a metadata change.
    pub fn replica_key(&self) -> Key {
        Key(blake3::derive_key(CONTEXT_REPLICA, &self.0))
    }

    /// The file's text: a header line naming the format version, then 64 hex digits.
    pub fn to_file_text(&self) -> String {
        format!("{SECRET_FILE_HEADER}\n{}\n", hex(&self.0))
    }

    /// Parses a secret file's text.
    pub fn from_file_text(text: &str) -> Result<Secret, AuthError> {
        let mut lines = text.lines();
        if lines.next().map(str::trim) != Some(SECRET_FILE_HEADER) {
            return Err(AuthError::SecretHeader);
        }
        let body = lines.next().unwrap_or("").trim();
        unhex::<KEY_BYTES>(body, "cluster secret").map(Secret)
    }
}

/// Names an access key: random, drawn by the manager; printed as `k` and 16 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct KeyId(pub u64);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "k{:016x}", self.0)
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for KeyId {
    type Err = AuthError;
    fn from_str(text: &str) -> Result<KeyId, AuthError> {
        let digits = text.strip_prefix('k').ok_or(AuthError::AccessKey)?;
        unhex::<8>(digits, "key id").map(|b| KeyId(u64::from_be_bytes(b)))
    }
}

/// Who a peer says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Claim {
    /// The operator (key derived from the cluster secret).
    Admin,
    /// A storage server (key derived from the cluster secret).
    Server,
    /// The holder of an access key.
    Client(KeyId),
}

impl Claim {
    /// The role the claim grants once proven.
    pub fn role(&self) -> Role {
        match self {
            Claim::Admin => Role::Admin,
            Claim::Server => Role::Server,
            Claim::Client(_) => Role::Client,
        }
    }

    fn bytes(&self) -> [u8; 9] {
        let mut out = [0u8; 9];
        match self {
            Claim::Admin => out[0] = 1,
            Claim::Server => out[0] = 2,
            Claim::Client(id) => {
                out[0] = 3;
                out[1..].copy_from_slice(&id.0.to_be_bytes());
            }
        }
        out
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Claim::Admin => f.write_str("admin"),
            Claim::Server => f.write_str("server"),
            Claim::Client(id) => write!(f, "client {id}"),
        }
    }
}

/// What an authenticated peer may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// The operator.
    Admin,
    /// A storage server.
    Server,
    /// A client with an access key.
    Client,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Role {
    /// Lower-case name, as errors print it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Server => "server",
            Role::Client => "client",
        }
    }
}

/// What a peer presents: its claim and the key that proves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credential {
    /// Who it says it is.
    pub claim: Claim,
    /// The key of that claim at the peer it talks to (a storage key toward servers).
    pub key: Key,
}

impl Credential {
    /// The credential for storage servers that stands for this one (manager credentials hold
    /// the principal's key, server credentials its [`Key::storage_key`]).
    pub fn for_storage(&self) -> Credential {
        Credential {
            claim: self.claim,
            key: self.key.storage_key(),
        }
    }
}

/// An access key as text, `KEYID:SECRET`, as `tessera key create` prints it and
/// `cluster.toml` holds it.
pub fn format_access_key(id: KeyId, key: &Key) -> String {
    format!("{id}:{}", key.to_hex())
}

/// Parses `KEYID:SECRET` into a client credential for the manager.
pub fn parse_access_key(text: &str) -> Result<Credential, AuthError> {
    let (id, key) = text.trim().split_once(':').ok_or(AuthError::AccessKey)?;
    Ok(Credential {
        claim: Claim::Client(id.parse().map_err(|_| AuthError::AccessKey)?),
        key: Key::from_hex(key).map_err(|_| AuthError::AccessKey)?,
    })
}

/// A handshake nonce: 32 fresh random bytes from each side.
pub type Nonce = [u8; KEY_BYTES];

/// Which end of a handshake computes a proof; the two proofs differ, so neither can be
/// reflected back as the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The side that connected (client, or server toward the manager).
    Connecting,
    /// The side that accepted.
    Accepting,
}

/// A proof of holding a key, bound to a handshake. Compared in constant time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof(pub [u8; KEY_BYTES]);

impl Proof {
    /// Whether `self` equals `other`, in time independent of where they differ.
    pub fn verify(&self, other: &Proof) -> bool {
        blake3::Hash::from_bytes(self.0) == blake3::Hash::from_bytes(other.0)
    }
}

/// The proof `side` sends in the handshake of `claim` with nonces `connecting` (sent first)
/// and `accepting`.
pub fn proof(key: &Key, side: Side, claim: &Claim, connecting: &Nonce, accepting: &Nonce) -> Proof {
    let mut hasher = blake3::Hasher::new_keyed(&key.0);
    hasher.update(CONTEXT_PROOF.as_bytes());
    hasher.update(&[HANDSHAKE_VERSION, side as u8]);
    hasher.update(&claim.bytes());
    hasher.update(connecting);
    hasher.update(accepting);
    Proof(*hasher.finalize().as_bytes())
}

/// The key of a datagram session set up by a handshake with these nonces: fresh for every
/// session, so that datagrams of one session cannot be replayed into another.
pub fn session_key(key: &Key, session: u64, connecting: &Nonce, accepting: &Nonce) -> Key {
    let mut material = Vec::with_capacity(KEY_BYTES * 3 + 8);
    material.extend_from_slice(&key.0);
    material.extend_from_slice(&session.to_be_bytes());
    material.extend_from_slice(connecting);
    material.extend_from_slice(accepting);
    Key(blake3::derive_key(CONTEXT_SESSION, &material))
}

/// An access key's secret, derived from the replicas' key and a seed the proposing replica
/// drew: every replica derives the same key from the ordered seed, and the seed alone, which
/// crosses the network, reveals nothing.
pub fn replicated_access_key(replica: &Key, seed: &[u8; KEY_BYTES]) -> Key {
    let mut material = [0u8; KEY_BYTES * 2];
    material[..KEY_BYTES].copy_from_slice(&replica.0);
    material[KEY_BYTES..].copy_from_slice(seed);
    Key(blake3::derive_key(CONTEXT_ACCESS, &material))
}

/// The MAC of one datagram: keyed BLAKE3 over its bytes, truncated to 16 bytes (the total
/// order's datagrams, `tessera-order-udp`; the storage datagrams use [`PacketMac`]).
pub fn packet_tag(key: &Key, datagram: &[u8]) -> [u8; PACKET_TAG_BYTES] {
    packet_tag_of_parts(key, &[datagram])
}

/// [`packet_tag`] of the datagram that `parts` make one after the other, without joining
/// them (a header, and a payload that is a slice of the message it belongs to).
pub fn packet_tag_of_parts(key: &Key, parts: &[&[u8]]) -> [u8; PACKET_TAG_BYTES] {
    let mut hasher = blake3::Hasher::new_keyed(&key.0);
    for part in parts {
        hasher.update(part);
    }
    let hash = hasher.finalize();
    let mut tag = [0u8; PACKET_TAG_BYTES];
    tag.copy_from_slice(&hash.as_bytes()[..PACKET_TAG_BYTES]);
    tag
}

/// A datagram session's MAC, keyed once: the AES-128-GCM-SIV tag (RFC 8452) of a datagram's
/// header and payload (the crate's doc says why). Its `Debug` never prints the keys.
#[derive(Clone)]
pub struct PacketMac {
    /// POLYVAL keyed with the message-authentication key, nothing hashed yet.
    polyval: Polyval,
    /// The same POLYVAL sixteen blocks at a time, where the CPU has AVX-512 VPCLMULQDQ.
    wide: Option<WidePolyval>,
    /// AES keyed with the message-encryption key.
    aes: Aes128,
    /// Names the key (one-way from it), so that a [`PayloadHash`] made under another key is
    /// never used.
    id: u64,
}

/// A datagram payload already hashed under one [`PacketMac`]: what [`PacketMac::tag_hashed`]
/// needs besides the header. The payload is the tag's associated data, hashed first, so its
/// POLYVAL can be computed by whoever queues the message (any thread, once per fragment,
/// however often the fragment is sent again) and the sender only hashes the header, whose
/// fields change at every transmission. Its `Debug` prints lengths only.
#[derive(Clone, PartialEq, Eq)]
pub struct PayloadHash {
    /// The [`PacketMac`] it was made under.
    mac: u64,
    /// Bytes of the payload.
    len: usize,
    /// POLYVAL's accumulator after the padded payload.
    state: [u8; 16],
}

impl fmt::Debug for PayloadHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PayloadHash({} bytes)", self.len)
    }
}

impl fmt::Debug for PacketMac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PacketMac(..)")
    }
}

impl PacketMac {
    /// The MAC of datagrams keyed by `key`: its AES-128-GCM-SIV key is derived one-way from
    /// `key` (a session key, or the public key), so the session key itself is never an AES
    /// key; then the message keys of [`PACKET_MAC_NONCE`] (RFC 8452 section 4: the first 8
    /// bytes of AES of a little-endian counter 0 to 3 and the nonce, two blocks for each).
    pub fn new(key: &Key) -> PacketMac {
        let key_generating = Aes128::new(&Self::gcm_siv_key(key).into());
        let mut message_keys = [[0u8; 16]; 2];
        for (counter, half) in (0u32..).zip(message_keys.as_flattened_mut().chunks_mut(8)) {
            let mut block = [0u8; 16];
            block[..4].copy_from_slice(&counter.to_le_bytes());
            block[4..].copy_from_slice(&PACKET_MAC_NONCE);
            let mut block = block.into();
            key_generating.encrypt_block(&mut block);
            half.copy_from_slice(&block[..8]);
        }
        let [authentication, encryption] = message_keys;
        let id = blake3::derive_key(CONTEXT_PACKET_MAC_ID, &key.0);
        PacketMac {
            polyval: Polyval::new(&authentication.into()),
            wide: WidePolyval::new(&authentication),
            aes: Aes128::new(&encryption.into()),
            id: u64::from_le_bytes(id[..8].try_into().expect("8 of 32 bytes")),
        }
    }

    /// The AES-128-GCM-SIV key of datagrams keyed by `key`.
    fn gcm_siv_key(key: &Key) -> [u8; 16] {
        let derived = blake3::derive_key(CONTEXT_PACKET_MAC, &key.0);
        let mut aes_key = [0u8; 16];
        aes_key.copy_from_slice(&derived[..16]);
        aes_key
    }

    /// The tag of the datagram made of `header` and then `payload`, neither copied: RFC
    /// 8452's tag with the payload as associated data and the header as plaintext.
    pub fn tag<const HEADER: usize>(
        &self,
        header: &[u8; HEADER],
        payload: &[u8],
    ) -> [u8; PACKET_TAG_BYTES] {
        let mut lengths = [0u8; 16];
        lengths[..8].copy_from_slice(&(payload.len() as u64 * 8).to_le_bytes());
        lengths[8..].copy_from_slice(&(HEADER as u64 * 8).to_le_bytes());
        // One pass over the whole datagram: with the wide POLYVAL, its tail, header and
        // lengths share one last group step.
        self.finish(self.polyval_of(&[payload, header, &lengths]))
    }

    /// [`tag`](Self::tag) of `header` and `payload`, with the payload's POLYVAL taken from
    /// `hash` when it was made under this MAC for a payload of this length (the caller's
    /// promise: of these very bytes), and computed here otherwise.
    pub fn tag_hashed<const HEADER: usize>(
        &self,
        header: &[u8; HEADER],
        payload: &[u8],
        hash: Option<&PayloadHash>,
    ) -> [u8; PACKET_TAG_BYTES] {
        match hash {
            Some(hash) if hash.mac == self.id && hash.len == payload.len() => {
                self.tag_of_hash(header, hash)
            }
            _ => self.tag(header, payload),
        }
    }

    /// The payload's part of its datagrams' tags under this MAC (see [`PayloadHash`]).
    pub fn payload_hash(&self, payload: &[u8]) -> PayloadHash {
        PayloadHash {
            mac: self.id,
            len: payload.len(),
            state: self.polyval_of(&[payload]),
        }
    }

    /// The tag, from the payload's hash on: POLYVAL goes on from the payload's accumulator
    /// (each step is `state = (state ^ block) * H`, so a fresh instance fed the next block
    /// XORed with the accumulator continues it), through the padded header and the lengths.
    fn tag_of_hash<const HEADER: usize>(
        &self,
        header: &[u8; HEADER],
        hash: &PayloadHash,
    ) -> [u8; PACKET_TAG_BYTES] {
        let mut lengths = [0u8; 16];
        lengths[..8].copy_from_slice(&(hash.len as u64 * 8).to_le_bytes());
        lengths[8..].copy_from_slice(&(HEADER as u64 * 8).to_le_bytes());
        if HEADER == 0 {
            return self.finish(self.polyval_of(&[&xor(lengths, &hash.state)]));
        }
        let head = HEADER.min(16);
        let mut block = [0u8; 16];
        block[..head].copy_from_slice(&header[..head]);
        let block = xor(block, &hash.state);
        self.finish(self.polyval_of(&[&block, &header[head..], &lengths]))
    }

    /// POLYVAL of `segments`, each zero-padded to whole blocks: sixteen blocks at a time
    /// where the CPU allows ([`WidePolyval`]), else the `polyval` crate.
    fn polyval_of(&self, segments: &[&[u8]]) -> [u8; 16] {
        if let Some(wide) = &self.wide {
            return wide.hash(segments);
        }
        let mut polyval = self.polyval.clone();
        for segment in segments {
            polyval.update_padded(segment);
        }
        polyval.finalize().into()
    }

    /// RFC 8452's last steps: the POLYVAL value XORed with the nonce, its top bit cleared,
    /// encrypted with the message-encryption key.
    fn finish(&self, polyval: [u8; 16]) -> [u8; PACKET_TAG_BYTES] {
        let mut tag = polyval;
        for (byte, nonce) in tag.iter_mut().zip(PACKET_MAC_NONCE) {
            *byte ^= nonce;
        }
        tag[15] &= 0x7f;
        let mut block = tag.into();
        self.aes.encrypt_block(&mut block);
        block.into()
    }

    /// Whether `tag` is the tag of `header` and `payload`, compared in constant time.
    pub fn verify<const HEADER: usize>(
        &self,
        header: &[u8; HEADER],
        payload: &[u8],
        tag: &[u8],
    ) -> bool {
        if tag.len() != PACKET_TAG_BYTES {
            return false;
        }
        let mut expected = [0u8; KEY_BYTES];
        expected[..PACKET_TAG_BYTES].copy_from_slice(&self.tag(header, payload));
        let mut carried = [0u8; KEY_BYTES];
        carried[..PACKET_TAG_BYTES].copy_from_slice(tag);
        Proof(expected).verify(&Proof(carried))
    }
}

/// Why a handshake or a request was refused: sent to the peer, and printed by the CLI as one
/// line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The peer presented no credential.
    #[error("not authenticated: this cluster needs an access key (see `tessera key create`)")]
    Unauthenticated,
    /// The claimed key is not known here (never issued, or revoked).
    #[error("unknown or revoked key: {0}")]
    UnknownKey(Claim),
    /// The proof did not match the claimed key.
    #[error("wrong key for {0}")]
    BadProof(Claim),
    /// The peer speaks another handshake version.
    #[error("handshake version {0} is not supported (this build speaks {HANDSHAKE_VERSION})")]
    Version(u8),
    /// The handshake did not follow the protocol.
    #[error("handshake violated: {0}")]
    Protocol(String),
}

fn xor(mut block: [u8; 16], other: &[u8; 16]) -> [u8; 16] {
    for (byte, other) in block.iter_mut().zip(other) {
        *byte ^= other;
    }
    block
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(text: &str, what: &'static str) -> Result<[u8; N], AuthError> {
    let bad = AuthError::Hex {
        what,
        expected: 2 * N,
    };
    if text.len() != 2 * N || !text.is_ascii() {
        return Err(bad);
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad.clone())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
