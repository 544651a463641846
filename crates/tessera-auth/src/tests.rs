use super::*;
use proptest::prelude::*;

fn secret(byte: u8) -> Secret {
    Secret::from_bytes([byte; KEY_BYTES])
}

#[test]
fn derived_keys_differ_by_role_and_secret() {
    let a = secret(1);
    assert_ne!(a.admin_key(), a.server_key());
    assert_ne!(a.admin_key(), secret(2).admin_key());
    assert_ne!(a.admin_key(), a.admin_key().storage_key());
    assert_eq!(a.server_key(), secret(1).server_key());
}

#[test]
fn secret_file_round_trips_and_refuses_garbage() {
    let s = secret(7);
    assert_eq!(Secret::from_file_text(&s.to_file_text()), Ok(s));
    assert_eq!(
        Secret::from_file_text("hello\n00"),
        Err(AuthError::SecretHeader)
    );
    let short = format!("{SECRET_FILE_HEADER}\nabcd\n");
    assert!(matches!(
        Secret::from_file_text(&short),
        Err(AuthError::Hex { .. })
    ));
}

#[test]
fn access_key_text_round_trips() {
    let key = Key([9; KEY_BYTES]);
    let text = format_access_key(KeyId(0x0123_4567_89ab_cdef), &key);
    assert_eq!(&text[..17], "k0123456789abcdef");
    let credential = parse_access_key(&text).unwrap();
    assert_eq!(
        credential.claim,
        Claim::Client(KeyId(0x0123_4567_89ab_cdef))
    );
    assert_eq!(credential.key, key);
    assert_eq!(parse_access_key("k00:zz"), Err(AuthError::AccessKey));
    assert_eq!(parse_access_key("nothing"), Err(AuthError::AccessKey));
}

#[test]
fn debug_never_prints_key_bytes() {
    assert_eq!(format!("{:?}", Key([0xab; KEY_BYTES])), "Key(..)");
    assert_eq!(format!("{:?}", secret(0xab)), "Secret(..)");
}

proptest! {
    /// A proof verifies only for the same key, side, claim and nonces: any one changed and it
    /// does not.
    #[test]
    fn proof_binds_key_side_claim_and_nonces(
        key in any::<[u8; 32]>(), other in any::<[u8; 32]>(),
        c in any::<[u8; 32]>(), a in any::<[u8; 32]>(), id in any::<u64>(), flip in 0usize..32,
    ) {
        prop_assume!(key != other);
        let key = Key(key);
        let claim = Claim::Client(KeyId(id));
        let p = proof(&key, Side::Connecting, &claim, &c, &a);
        prop_assert!(p.verify(&proof(&key, Side::Connecting, &claim, &c, &a)));
        prop_assert!(!p.verify(&proof(&Key(other), Side::Connecting, &claim, &c, &a)));
        prop_assert!(!p.verify(&proof(&key, Side::Accepting, &claim, &c, &a)));
        prop_assert!(!p.verify(&proof(&key, Side::Connecting, &Claim::Server, &c, &a)));
        let mut c2 = c;
        c2[flip] ^= 1;
        prop_assert!(!p.verify(&proof(&key, Side::Connecting, &claim, &c2, &a)));
        prop_assert!(!p.verify(&proof(&key, Side::Connecting, &claim, &a, &c)) || a == c);
    }

    /// A datagram's tag changes with any flipped bit and with the key.
    #[test]
    fn packet_tag_detects_any_bit_flip(
        bytes in proptest::collection::vec(any::<u8>(), 1..2000), bit in any::<usize>(),
        key in any::<[u8; 32]>(),
    ) {
        let key = Key(key);
        let tag = packet_tag(&key, &bytes);
        let mut flipped = bytes.clone();
        let bit = bit % (bytes.len() * 8);
        flipped[bit / 8] ^= 1 << (bit % 8);
        prop_assert_ne!(tag, packet_tag(&key, &flipped));
        prop_assert_ne!(tag, packet_tag(&key.storage_key(), &bytes));
    }
}

proptest! {
    /// A datagram MAC changes with any flipped bit of header, payload or tag, and with the
    /// key; the tag of the same bytes under the same key is the same (a deterministic MAC).
    #[test]
    fn packet_mac_refuses_any_bit_flip_and_any_other_key(
        header in any::<[u8; 40]>(),
        payload in proptest::collection::vec(any::<u8>(), 0..3000),
        bit in any::<usize>(),
        key in any::<[u8; 32]>(),
    ) {
        let key = Key(key);
        let mac = PacketMac::new(&key);
        let tag = mac.tag(&header, &payload);
        prop_assert_eq!(tag, PacketMac::new(&key).tag(&header, &payload));
        prop_assert!(mac.verify(&header, &payload, &tag));
        prop_assert!(!PacketMac::new(&key.storage_key()).verify(&header, &payload, &tag));
        let total_bits = (header.len() + payload.len() + tag.len()) * 8;
        let bit = bit % total_bits;
        let (mut header, mut payload, mut tag) = (header, payload.clone(), tag);
        let byte = bit / 8;
        let mask = 1u8 << (bit % 8);
        if byte < header.len() {
            header[byte] ^= mask;
        } else if byte < header.len() + payload.len() {
            payload[byte - header.len()] ^= mask;
        } else {
            tag[byte - header.len() - payload.len()] ^= mask;
        }
        prop_assert!(!mac.verify(&header, &payload, &tag));
    }
}

/// Moving bytes between header and payload changes the tag: the split is part of what is
/// authenticated (the lengths of both enter POLYVAL), so a datagram cannot be re-cut.
#[test]
fn packet_mac_binds_where_the_header_ends() {
    let mac = PacketMac::new(&Key([7; 32]));
    let bytes = [9u8; 48];
    let short: [u8; 8] = bytes[..8].try_into().unwrap();
    let long: [u8; 16] = bytes[..16].try_into().unwrap();
    assert_ne!(mac.tag(&short, &bytes[8..]), mac.tag(&long, &bytes[16..]));
    assert!(!mac.verify(&short, &bytes[8..40], &mac.tag(&long, &bytes[16..40])));
    assert!(
        !mac.verify(&short, &bytes[..], &[0; 15]),
        "a short tag never verifies"
    );
}

/// Prints the speed of the datagram MAC against the keyed BLAKE3 it replaced, at the payloads
/// of a 1500-byte LAN, jumbo frames and loopback (`docs/notes/dp10.md`). Print only: run with
/// `cargo test --release -p tessera-auth -- --ignored --nocapture packet_mac_speed`.
#[test]
#[ignore]
fn packet_mac_speed_against_blake3() {
    let key = Key([5; KEY_BYTES]);
    let mac = PacketMac::new(&key);
    for payload_len in [1_416usize, 8_916, 65_451] {
        let header = [1u8; 40];
        let payload = vec![7u8; payload_len];
        let rounds = (256 << 20) / payload_len;
        let gcm_siv = time_per_datagram(rounds, || mac.tag(&header, &payload)[0]);
        let blake3 = time_per_datagram(rounds, || {
            packet_tag_of_parts(&key, &[&header, &payload])[0]
        });
        let gb_per_s = |ns: f64| (header.len() + payload_len) as f64 / ns;
        println!(
            "payload {payload_len:>6} B: AES-128-GCM-SIV {gcm_siv:>8.0} ns ({:.2} GB/s), keyed BLAKE3 {blake3:>8.0} ns ({:.2} GB/s), {:.2}x",
            gb_per_s(gcm_siv),
            gb_per_s(blake3),
            blake3 / gcm_siv,
        );
    }
}

/// Nanoseconds per call of `tag`, over `rounds` calls after a tenth as many to warm up.
fn time_per_datagram(rounds: usize, mut tag: impl FnMut() -> u8) -> f64 {
    let mut sink = 0u8;
    for _ in 0..rounds / 10 {
        sink ^= tag();
    }
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        sink ^= tag();
    }
    std::hint::black_box(sink);
    start.elapsed().as_nanos() as f64 / rounds as f64
}

proptest! {
    /// The datagram MAC is AES-128-GCM-SIV's tag, as RustCrypto's `aes-gcm-siv` computes it
    /// (RFC 8452, its test vectors in that crate): payload as associated data, header as
    /// plaintext, the constant nonce, the key derived from the session key.
    #[test]
    fn packet_mac_is_aes_128_gcm_siv(
        header in any::<[u8; 40]>(),
        payload in proptest::collection::vec(any::<u8>(), 0..3000),
        key in any::<[u8; 32]>(),
    ) {
        use aes_gcm_siv::aead::{AeadInOut, KeyInit};
        let key = Key(key);
        let reference = aes_gcm_siv::Aes128GcmSiv::new(&PacketMac::gcm_siv_key(&key).into());
        let mut plaintext = header;
        let expected = reference
            .encrypt_inout_detached(&PACKET_MAC_NONCE.into(), &payload, (&mut plaintext[..]).into())
            .unwrap();
        prop_assert_eq!(PacketMac::new(&key).tag(&header, &payload), <[u8; 16]>::from(expected));
    }

    /// The tag computed from a payload's hash is AES-128-GCM-SIV's for every header length
    /// the continuation treats apart (none, part of a block, a block, more), and a hash made
    /// under another key or for another length is not used: the tag is the payload's own.
    #[test]
    fn a_tag_from_a_payload_hash_is_the_tag(
        payload in proptest::collection::vec(any::<u8>(), 0..100),
        other in proptest::collection::vec(any::<u8>(), 0..100),
        key in any::<[u8; 32]>(),
    ) {
        use aes_gcm_siv::aead::{AeadInOut, KeyInit};
        let key = Key(key);
        let mac = PacketMac::new(&key);
        let reference = aes_gcm_siv::Aes128GcmSiv::new(&PacketMac::gcm_siv_key(&key).into());
        fn expected<const H: usize>(reference: &aes_gcm_siv::Aes128GcmSiv, header: [u8; H], payload: &[u8]) -> [u8; 16] {
            let mut plaintext = header;
            reference
                .encrypt_inout_detached(&PACKET_MAC_NONCE.into(), payload, (&mut plaintext[..]).into())
                .unwrap()
                .into()
        }
        let hash = mac.payload_hash(&payload);
        prop_assert_eq!(mac.tag_hashed(&[], &payload, Some(&hash)), expected(&reference, [], &payload));
        prop_assert_eq!(mac.tag_hashed(&[5; 7], &payload, Some(&hash)), expected(&reference, [5; 7], &payload));
        prop_assert_eq!(mac.tag_hashed(&[6; 16], &payload, Some(&hash)), expected(&reference, [6; 16], &payload));
        prop_assert_eq!(mac.tag_hashed(&[7; 33], &payload, Some(&hash)), expected(&reference, [7; 33], &payload));
        let stranger = PacketMac::new(&key.storage_key()).payload_hash(&payload);
        prop_assert_eq!(mac.tag_hashed(&[8; 40], &payload, Some(&stranger)), mac.tag(&[8; 40], &payload));
        let longer: Vec<u8> = payload.iter().chain(&[1]).copied().collect();
        let wrong_len = mac.payload_hash(&longer);
        prop_assert_eq!(mac.tag_hashed(&[9; 40], &payload, Some(&wrong_len)), mac.tag(&[9; 40], &payload));
        prop_assert_eq!(mac.tag_hashed(&[9; 40], &other, None), mac.tag(&[9; 40], &other));
    }
}
